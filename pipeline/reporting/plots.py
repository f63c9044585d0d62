"""The evaluate stage's PNG plots (reports/plots/): confusion matrices, per-type F1, learning curves, attention.

Each function writes its files into ``out`` and returns their names (for the report's links);
matplotlib runs headless: every caller calls :func:`use_headless` before its first plot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.reports.evaluation import Model, TaskEvaluation
from pipeline.reporting.attention import plot_attention
from pipeline.reporting.curves import read_curves
from pipeline.reporting.figures import save_figure


def plot_confusions(extras: dict[str, Any], out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    written = []
    for name, e in extras.items():
        if "confusion" not in e:
            continue
        fig, axes = plt.subplots(1, len(e["confusion"]), figsize=(5.5 * len(e["confusion"]), 5), squeeze=False)
        for ax, (model, matrix) in zip(axes[0], e["confusion"].items(), strict=True):
            m = np.array(matrix)
            ax.imshow(m, cmap="Blues")
            ax.set(
                title=f"{name}: {model}",
                xlabel="predicted",
                ylabel="gold",
                xticks=range(len(e["labels"])),
                yticks=range(len(e["labels"])),
            )
            ax.set_xticklabels(e["labels"], rotation=45, ha="right", fontsize=8)
            ax.set_yticklabels(e["labels"], fontsize=8)
            for (i, j), v in np.ndenumerate(m):
                ax.text(
                    j, i, str(v), ha="center", va="center", fontsize=8, color="white" if v > m.max() / 2 else "black"
                )
        written.append(save_figure(fig, out / f"confusion_{name}.png"))
    return written


BREAKDOWNS = {"per_type": "entity F1 by type", "per_label": "F1 by label"}  # metric keys a task type may report


def breakdown_of(task: TaskEvaluation) -> str | None:
    """The per-type / per-label F1 breakdown a task's metrics carry (NER, multi-label), if any."""
    return next((key for key in BREAKDOWNS if key in task.adapted), None)


def plot_entity_f1(tasks: dict[str, TaskEvaluation], out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    written = []
    for name, task in tasks.items():
        key = breakdown_of(task)
        if key is None:
            continue
        models: list[Model] = [m for m in ("adapted", "baseline") if task.scores(m) is not None]
        types = sorted(task.breakdown("adapted", key))
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(types) + 2), 4))
        width = 0.8 / len(models)
        for k, model in enumerate(models):
            ax.bar(
                np.arange(len(types)) + k * width,
                [task.breakdown(model, key).get(t, {}).get("f1", 0.0) for t in types],
                width,
                label=model,
            )
        ax.set(
            title=f"{name}: {BREAKDOWNS[key]} (test)",
            ylim=(0, 1.18),  # headroom above F1 = 1 for the legend, which covered the tallest bars
            yticks=np.linspace(0, 1, 6),
            ylabel="F1",
            xticks=np.arange(len(types)) + width * (len(models) - 1) / 2,
        )
        ax.set_xticklabels(types)
        ax.legend(loc="upper center", ncol=len(models), frameon=False)
        prefix = "entity" if key == "per_type" else "label"
        written.append(save_figure(fig, out / f"{prefix}_f1_{name}.png"))
    return written


def plot_learning_curves(curves_dir: Path, out: Path) -> list[str]:
    """Train loss and dev mean primary metric of every model under ``curves_dir`` (a folder per model)."""
    import matplotlib.pyplot as plt

    fig, (loss_ax, dev_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for model_dir in sorted(p for p in curves_dir.iterdir() if p.is_dir()) if curves_dir.is_dir() else []:
        for ax, file, key in ((loss_ax, "train.csv", "loss"), (dev_ax, "dev.csv", "eval_mean_primary")):
            series = read_curves(model_dir / file)
            if key in series:
                steps, values = zip(*series[key], strict=True)
                ax.plot(steps, values, marker="o" if key != "loss" else None, label=model_dir.name)
    loss_ax.set(title="train loss (task-weighted)", xlabel="step", ylabel="loss")
    dev_ax.set(title="dev: mean primary metric", xlabel="step", ylabel="mean primary metric")
    for ax in (loss_ax, dev_ax):
        if ax.lines:  # a run too short to log has no curve
            ax.legend()
        ax.grid(alpha=0.3)
    return [save_figure(fig, out / "learning_curves.png")]


def plot_attention_views(extras: dict[str, Any], ec: Any, out: Path) -> list[str]:
    """``attention_<task>_<k>.png``: the models' attention side by side, and their difference where both
    tokenize the example alike."""
    heads = "mean of the heads" if ec.attention_head is None else f"head {ec.attention_head}"
    written = []
    for name, e in extras.items():
        for k, view in enumerate(e.get("attention", []), start=1):
            panels = view["panels"]
            same = len(panels) == 2 and panels[0][1] == panels[1][1]
            diff = panels[0][2] - panels[1][2] if same else None
            title = f"{name}: test example {view['example'] + 1}, {view['layer']}, {heads}"
            written.append(plot_attention(title, panels, diff, out / f"attention_{name}_{k}.png"))
    return written
