"""Attention views: what the adapted and the baseline model attend to, on a few test examples per task.

For each chosen example (the first test examples short enough to read), the attention probabilities
of one layer (one head, or the mean over its heads) of each model are drawn as token x token
heatmaps, side by side, with their difference when both models tokenize the example alike. The
per-head importance the pruned variant was built from is drawn by the compress stage
(``reports/compression/head_importance.png``) with :func:`plot_head_importance`.

Attention weights are not explanations (Jain and Wallace 2019); they show where a layer looks, and
adaptation changing it is a hint, not a proof. Written here because neither ``transformers`` nor
``bertviz`` (an interactive notebook widget) writes static PNGs for a report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.errors import ConfigError
from pipeline.modelling.precision import attention_kernel


def first_window(ids: list[Any]) -> list[int]:
    """An example's token ids (its first window, for ``long_text: windows``)."""
    return ids[0] if ids and isinstance(ids[0], list) else ids


def pick_examples(features: Any, count: int, max_tokens: int) -> list[int]:
    """Indices of the first ``count`` test examples with at most ``max_tokens`` tokens (else the shortest ones)."""
    lengths = [len(first_window(ids)) for ids in features["input_ids"]]
    short = [i for i, n in enumerate(lengths) if n <= max_tokens]
    if len(short) < count:
        short += [i for i in np.argsort(lengths, kind="stable").tolist() if i not in short]
    return short[:count]


def attention_map(model: Any, ids: list[int], types: list[int] | None, layer: int, head: int | None) -> np.ndarray:
    """``[tokens, tokens]`` attention probabilities of ``layer`` (``head``, or the mean over heads) for one input."""
    import torch

    encoder = model.encoder
    layers = int(encoder.config.num_hidden_layers)
    if not -layers <= layer < layers:
        raise ConfigError(f"evaluate.attention_layer: {layer} is not a layer of a {layers}-layer encoder")
    with attention_kernel(encoder, "eager"), torch.inference_mode():  # SDPA returns no attention probabilities
        out = encoder(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            token_type_ids=None if types is None else torch.tensor([types]),
            output_attentions=True,
        )
    probs = out.attentions[layer][0].float().numpy()  # [heads, tokens, tokens]
    if head is not None and not 0 <= head < probs.shape[0]:
        raise ConfigError(f"evaluate.attention_head: {head} is not a head of a layer with {probs.shape[0]} heads")
    return probs.mean(0) if head is None else probs[head]


def plot_attention(
    title: str, panels: list[tuple[str, list[str], np.ndarray]], diff: np.ndarray | None, path: Path
) -> str:
    """One row of heatmaps (each model's attention, then adapted - baseline when given); the file name."""
    import matplotlib.pyplot as plt

    count = len(panels) + (diff is not None)
    n = max(len(tokens) for _, tokens, _ in panels)
    size = min(max(4.0, 0.16 * n + 1.5), 8.0)
    # two panels a row: three in one row, scaled to the page's width, left ~5 px per token label
    cols = min(2, count)
    rows = math.ceil(count / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(size * cols, size * rows), squeeze=False)
    axes = list(grid.flat)
    for unused in axes[count:]:
        unused.axis("off")
    shown = [*panels, *([("adapted - baseline", panels[0][1], diff)] if diff is not None else [])]
    for ax, (name, tokens, matrix) in zip(axes[:count], shown, strict=True):
        if name == "adapted - baseline":
            limit = float(np.abs(matrix).max()) or 1.0
            im = ax.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit)
        else:
            im = ax.imshow(matrix, cmap="viridis", vmin=0.0)
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(len(tokens)))
        ax.set_yticks(range(len(tokens)))
        ax.set_xticklabels(tokens, rotation=90, fontsize=7)
        ax.set_yticklabels(tokens, fontsize=7)
        ax.set_xlabel("attended token", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def plot_head_importance(importance: list[list[float]], kept: dict[int, list[int]], path: Path) -> None:
    """The ``[layers, heads]`` importance heatmap the pruned variant was built from; removed heads crossed out."""
    import matplotlib.pyplot as plt

    m = np.array(importance)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * m.shape[1] + 2), max(3.0, 0.45 * m.shape[0] + 1.5)))
    im = ax.imshow(m, cmap="viridis")
    for layer in range(m.shape[0]):
        for head in range(m.shape[1]):
            if head not in kept.get(layer, []):
                ax.text(head, layer, "x", ha="center", va="center", color="white", fontsize=10)
    ax.set(xlabel="head", ylabel="layer", title="head importance (x: pruned)")
    ax.set_xticks(range(m.shape[1]))
    ax.set_yticks(range(m.shape[0]))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def attention_views(models: dict[str, Any], task: str, ec: Any) -> list[dict[str, Any]]:
    """Each model's attention (``evaluate.attention_*``) on the first short test examples of ``task``."""
    adapted = models["adapted"][2][task].splits["test"]
    views = []
    for i in pick_examples(adapted, ec.attention_examples, ec.attention_max_tokens):
        panels = []
        for name, (model, tok, tasks) in models.items():
            feature = tasks[task].splits["test"][i]
            ids = first_window(feature["input_ids"])
            types = first_window(feature["token_type_ids"]) if "token_type_ids" in feature else None
            matrix = attention_map(model, ids, types, ec.attention_layer, ec.attention_head)
            n = min(len(ids), ec.attention_max_tokens)  # a long example is drawn up to its first n tokens
            panels.append((name, tok.convert_ids_to_tokens(ids[:n]), matrix[:n, :n]))
        layers = int(models["adapted"][0].encoder.config.num_hidden_layers)
        views.append({"example": i, "panels": panels, "layer": f"layer {ec.attention_layer % layers + 1} of {layers}"})
    return views
