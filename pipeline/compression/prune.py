"""Attention-head pruning: gradient importance of every head (Michel et al. 2019) and physical slicing.

Importance: a gate of 1.0 multiplies each head's context vector; ``|dL/dgate|`` summed over dev
batches of every task (the task's own loss against gold labels) says how much the loss depends on
the head; scores are normalised per layer (L2), as in the paper, and ranked over the whole model.
Slicing: transformers 5 no longer has ``prune_heads``, so :func:`slice_heads` rebuilds each layer's
query/key/value projections with the rows of the kept heads and the attention output projection
with their columns; the kept heads compute exactly what they computed before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


def head_count(encoder: Any) -> list[int]:
    """Attention heads per layer of a (possibly pruned) BERT encoder."""
    return [int(layer.attention.self.num_attention_heads) for layer in encoder.encoder.layer]


@contextmanager
def gated_heads(encoder: Any, gates: Any) -> Iterator[None]:
    """Multiply head ``h`` of layer ``l``'s context output by ``gates[l][h]`` while inside (forward hooks)."""
    handles = []
    for index, layer in enumerate(encoder.encoder.layer):
        attn = layer.attention.self

        def hook(module: Any, args: Any, output: Any, index: int = index, d: int = attn.attention_head_size) -> Any:
            context = output[0]
            shape = context.shape
            gated = (context.view(*shape[:-1], -1, d) * gates[index].to(context.dtype)[:, None]).view(shape)
            return (gated, *output[1:])

        handles.append(attn.register_forward_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def head_importance(model: Any, tasks: dict[str, Any], pad_id: int, batch_size: int, batches: int) -> np.ndarray:
    """``[layers, heads]`` importance: ``sum |dL/dgate|`` over ``batches`` dev batches per task, L2-normalised per layer."""
    import torch

    encoder = model.encoder
    counts = head_count(encoder)
    gates = [torch.ones(n, requires_grad=True) for n in counts]
    total = [torch.zeros(n) for n in counts]
    model.eval()  # no dropout: the gradient of the model that will be served
    with gated_heads(encoder, gates):
        for name, data in tasks.items():
            kind = data.spec.kind
            features = data.splits["validation"]
            for start in range(0, min(len(features), batch_size * batches), batch_size):
                rows = features[start : start + batch_size]
                feats = [{k: rows[k][j] for k in rows} for j in range(len(rows["input_ids"]))]
                batch = kind.collate(feats, pad_id)
                out = model(task=name, **{k: v for k, v in batch.items() if k != "task"})
                grads = torch.autograd.grad(out["loss"], gates)
                for t, g in zip(total, grads, strict=True):
                    t += g.abs()
    scores = np.stack([t.numpy() for t in total]) if len(set(counts)) == 1 else None
    if scores is None:
        raise ValueError(f"head importance needs the same number of heads in every layer, got {counts}")
    norms = np.linalg.norm(scores, axis=1, keepdims=True)
    return scores / np.where(norms > 0, norms, 1.0)


def heads_to_keep(importance: np.ndarray, fraction: float) -> dict[int, list[int]]:
    """Layer -> kept head indices after removing the ``fraction`` least important heads overall.

    Every layer keeps at least its most important head (a layer without attention would have
    nothing for its output projection to read). Ties break by position, so the result is stable.
    """
    layers, heads = importance.shape
    order = np.lexsort((np.arange(importance.size), importance.ravel()))  # ascending importance
    remove = round(fraction * importance.size)
    keep = {layer: set(range(heads)) for layer in range(layers)}
    removed = 0
    for flat in order:
        if removed == remove:
            break
        layer, head = divmod(int(flat), heads)
        if len(keep[layer]) > 1:
            keep[layer].discard(head)
            removed += 1
    return {layer: sorted(h) for layer, h in keep.items()}


def _sliced(linear: Any, index: Any, dim: int) -> Any:
    """A new ``nn.Linear`` with the rows (``dim=0``) or columns (``dim=1``) ``index`` of ``linear``."""
    from torch import nn

    weight = linear.weight.detach().index_select(dim, index).clone()
    bias = linear.bias.detach().clone() if dim == 1 else linear.bias.detach()[index].clone()
    new = nn.Linear(weight.shape[1], weight.shape[0], device=weight.device, dtype=weight.dtype)
    new.weight.data.copy_(weight)
    new.bias.data.copy_(bias)
    return new


def slice_heads(encoder: Any, keep: dict[int, list[int]]) -> None:
    """Cut every layer down to the heads in ``keep`` (in place); a layer not in ``keep`` keeps all its heads."""
    import torch

    for index, layer in enumerate(encoder.encoder.layer):
        if index not in keep:
            continue
        attn, out = layer.attention.self, layer.attention.output
        d = attn.attention_head_size
        heads = sorted(keep[index])
        if not heads or heads[-1] >= attn.num_attention_heads:
            raise ValueError(f"layer {index}: cannot keep heads {heads} of {attn.num_attention_heads}")
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])
        attn.query, attn.key, attn.value = (_sliced(m, rows, 0) for m in (attn.query, attn.key, attn.value))
        out.dense = _sliced(out.dense, rows, 1)
        attn.num_attention_heads, attn.all_head_size = len(heads), len(heads) * d
