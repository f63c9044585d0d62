"""Adversarial fine-tuning on the word embeddings: FGM (one step) and PGD (projected steps).

After the clean loss's backward pass, the word-embedding matrix is moved along its gradient, the
loss is computed again on the perturbed embeddings and its gradient is added to the clean one;
then the embeddings are put back exactly (Miyato et al. 2017 for FGM; Madry et al. 2018 and
ALUM, Liu et al. 2020, for PGD). The optimiser then steps on clean + adversarial gradients.

- FGM: ``r = epsilon * g / ||g||`` (L2 norm over the whole matrix).
- PGD: ``steps`` steps of ``alpha * g / ||g||``, each projected back onto the L2 ball of radius
  ``epsilon`` around the clean embeddings; the gradients of the intermediate steps are
  discarded, only the last step's adversarial gradient joins the clean one.

No library offers this for an arbitrary ``nn.Module`` (HF Trainer has no adversarial hook), hence
this module. ``finetune.adversarial`` turns it on for the fine-tuned models (the Trainer's
``training_step`` in :mod:`pipeline.training.trainer` calls it after the clean backward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

LossFn = Callable[[], torch.Tensor]  # recomputes the loss of the current batch with the current weights


@dataclass(frozen=True)
class Adversarial:
    """What ``finetune.adversarial*`` asks for: the method, the L2 radius and PGD's steps and step length."""

    method: str  # fgm | pgd
    epsilon: float
    steps: int = 1
    alpha: float | None = None  # PGD step length; None: epsilon / steps

    @classmethod
    def from_config(cls, fc: Any) -> Adversarial | None:
        """From the finetune section; None for ``adversarial: none``."""
        if fc.adversarial == "none":
            return None
        steps = fc.adversarial_steps if fc.adversarial == "pgd" else 1
        return cls(fc.adversarial, fc.adversarial_epsilon, steps, fc.adversarial_alpha)

    def describe(self) -> str:
        """``fgm, epsilon 1`` / ``pgd, epsilon 1, 3 steps of 0.333``: for the console and reports."""
        if self.method == "fgm":
            return f"fgm, epsilon {self.epsilon:g}"
        return f"pgd, epsilon {self.epsilon:g}, {self.steps} steps of {self.alpha or self.epsilon / self.steps:.3g}"

    def backward(self, model: torch.nn.Module, loss_fn: LossFn) -> dict[str, Any]:
        """:func:`adversarial_backward` with these settings."""
        return adversarial_backward(model, loss_fn, self.method, self.epsilon, self.alpha, self.steps)


def word_embeddings(model: torch.nn.Module) -> torch.nn.Parameter:
    """The word-embedding matrix of a BERT-like model (``get_input_embeddings``, or the encoder's)."""
    candidates: list[Any] = [model, getattr(model, "encoder", None), getattr(model, "bert", None)]
    for candidate in candidates:
        if candidate is not None and hasattr(candidate, "get_input_embeddings"):
            return candidate.get_input_embeddings().weight
    raise TypeError(f"{type(model).__name__} has no input embeddings to perturb")


def unit_step(grad: torch.Tensor) -> torch.Tensor | None:
    """``grad / ||grad||`` in fp32, or ``None`` for a zero or non-finite gradient (nothing to follow)."""
    norm = torch.linalg.vector_norm(grad.float())
    if not torch.isfinite(norm) or norm == 0:
        return None
    return grad.float() / norm


def project(delta: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``delta`` scaled back onto the L2 ball of radius ``epsilon`` if it left it."""
    norm = torch.linalg.vector_norm(delta)
    return delta * (epsilon / norm) if norm > epsilon else delta


def adversarial_backward(
    model: torch.nn.Module, loss_fn: LossFn, method: str, epsilon: float, alpha: float | None = None, steps: int = 1
) -> dict[str, Any]:
    """Add the adversarial loss's gradient to the clean gradient already in ``model`` (call after the clean
    ``backward``); the embeddings are restored bit-exactly, also when ``loss_fn`` raises.

    ``method``: ``fgm`` or ``pgd``; ``epsilon``: the perturbation's L2 radius (> 0); ``alpha``: PGD's step
    length (default ``epsilon / steps``). Returns ``{"adv_loss": float | None, "delta_norm": float}``
    (``None`` and 0 when the gradient was zero and nothing was perturbed).
    """
    if method not in ("fgm", "pgd"):
        raise ValueError(f"adversarial method must be fgm or pgd, got {method!r}")
    if not epsilon > 0:
        raise ValueError(f"adversarial epsilon must be > 0, got {epsilon}")
    emb = word_embeddings(model)
    if emb.grad is None or (direction := unit_step(emb.grad)) is None:
        return {"adv_loss": None, "delta_norm": 0.0}
    clean = emb.data.clone()
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        if method == "fgm":
            delta = epsilon * direction
            emb.data.add_(delta.to(emb.dtype))
            adv = loss_fn()
            adv.backward()  # accumulates onto the clean gradient
            return {"adv_loss": float(adv.detach()), "delta_norm": float(torch.linalg.vector_norm(delta))}
        return _pgd(emb, clean, params, loss_fn, direction, epsilon, alpha or epsilon / steps, steps)
    finally:
        emb.data.copy_(clean)


def _pgd(
    emb: torch.nn.Parameter,
    clean: torch.Tensor,
    params: list[torch.nn.Parameter],
    loss_fn: LossFn,
    direction: torch.Tensor,
    epsilon: float,
    alpha: float,
    steps: int,
) -> dict[str, Any]:
    clean_grads = [None if p.grad is None else p.grad.clone() for p in params]
    delta = torch.zeros_like(clean, dtype=torch.float32)
    adv = None
    for step in range(steps):
        delta = project(delta + alpha * direction, epsilon)
        emb.data.copy_(clean + delta.to(clean.dtype))
        for p in params:  # this step's gradient alone: it points the next step
            p.grad = None
        adv = loss_fn()
        adv.backward()
        if step < steps - 1:
            nxt = unit_step(emb.grad) if emb.grad is not None else None
            if nxt is None:
                break
            direction = nxt
    for p, g in zip(params, clean_grads, strict=True):  # clean + the last step's adversarial gradient
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g
    return {
        "adv_loss": None if adv is None else float(adv.detach()),
        "delta_norm": float(torch.linalg.vector_norm(delta)),
    }
