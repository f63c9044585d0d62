"""Dropout with a faster random source on CPUs, for the training loops.

PyTorch draws a CPU dropout mask with ``bernoulli_``, one Mersenne-Twister number per element: on a
2-core AMX Xeon that was 18% of a bf16 MiniLM fine-tuning step (20 dropouts a step, ~5 ns an
element), more than any matrix multiplication. Here the mask comes from NumPy's PCG64 (16 random
bits per element, compared with ``p`` scaled to 65,536: ``p`` exact to 1/65,536) and the same
``x * mask / (1 - p)`` follows; the forward and backward of a dropout ran 2.7-3.1x faster (docs/speed.md).
Same distribution, another random stream: runs stay reproducible (each mask's NumPy seed is drawn from
torch's generator, which ``set_seed`` seeds and the Trainer's checkpoints save), but draw other masks
than ``torch.nn.Dropout`` would. On a GPU PyTorch's own (Philox) dropout is fast and is kept.

:func:`training_kernels` (what the training loops enter) switches a model's ``nn.Dropout`` modules and its attention-probability dropout
(an eager attention kernel registered with transformers as :data:`EAGER_CPU_DROPOUT`) for one
training loop and restores them after it; saved checkpoints never see the switch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.modelling.precision import EAGER_CPU_DROPOUT, Precision, attention_kernel

MASK_LEVELS = 65536  # 16 random bits per element


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """A boolean mask of ``shape``, each element True (kept) with probability ``1 - p`` (``p`` rounded to
    1/65,536), from a PCG64 generator seeded by torch's default CPU generator."""
    seed = int(torch.randint(0, 2**62, (1,)))  # one draw of torch's RNG: set_seed and checkpoints govern the stream
    bits = np.random.default_rng(seed).integers(0, MASK_LEVELS, tuple(shape), dtype=np.uint16)
    return torch.from_numpy(bits >= round(p * MASK_LEVELS))


def apply_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``torch.nn.functional.dropout`` with a :func:`keep_mask` on CPU tensors (PyTorch's own elsewhere)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return nn.functional.dropout(x, p, training)
    scale = keep_mask(x.shape, p).to(x.dtype).mul_(1.0 / (1.0 - p))  # autograd keeps it for the backward
    return x * scale


class CpuDropout(nn.Dropout):
    """``nn.Dropout`` drawing its mask with :func:`keep_mask` on CPU tensors (same ``p``, same state dict)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.inplace:  # nothing in our models asks for it; PyTorch's own keeps its semantics
            return super().forward(input)
        return apply_dropout(input, self.p, self.training)


def eager_attention_cpu_dropout(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,  # what else transformers passes (unused by eager attention)
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``eager_attention_forward`` (BERT's, 5.x), with :func:`apply_dropout` on the probabilities: the
    interface has no hook for the dropout alone, so its eight lines are repeated here."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1)
    weights = apply_dropout(weights, dropout, module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def register_attention() -> None:
    """Make :data:`EAGER_CPU_DROPOUT` a transformers attention implementation (with eager attention's masks)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(EAGER_CPU_DROPOUT, eager_attention_cpu_dropout)
    AttentionMaskInterface.register(EAGER_CPU_DROPOUT, eager_mask)


@contextlib.contextmanager
def cpu_dropout(model: nn.Module) -> Iterator[None]:
    """Inside the block every ``nn.Dropout`` of ``model`` is a :class:`CpuDropout`; after it, what it was."""
    swapped = [(m, type(m)) for m in model.modules() if type(m) is nn.Dropout]
    for m, _ in swapped:
        m.__class__ = CpuDropout  # same attributes and state dict: only forward differs
    try:
        yield
    finally:
        for m, cls in swapped:
            m.__class__ = cls


@contextlib.contextmanager
def training_kernels(model: Any, precision: Precision) -> Iterator[None]:
    """Inside the block ``model`` trains with ``precision.training_attention`` and, on a CPU, every dropout draws
    its mask from NumPy (:func:`keep_mask`); after it, the kernels and modules it had."""
    if precision.device != "cpu":
        with attention_kernel(model, precision.training_attention):
            yield
        return
    register_attention()
    with attention_kernel(model, precision.training_attention), cpu_dropout(model):
        yield
