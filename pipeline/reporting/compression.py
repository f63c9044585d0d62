"""The compression report: the accuracy/latency front (plot) and compression.md, from reports/compression.json."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.reports.compression import Build, CompressionReport
from pipeline.reporting.numbers import points
from pipeline.reporting.tables import front_view, to_markdown
from pipeline.reporting.timing import timing_noise


def noisy_timings(report: CompressionReport) -> list[str]:
    """``model (precision): why`` for every timing of the report that is not to be taken at face value."""
    return [
        f"{name} ({p}): {why}"
        for name, entry in report.models().items()
        for p, s in (entry.speed.precisions() if entry.speed else {}).items()
        if (why := timing_noise(s))
    ]


def front_points(report: CompressionReport) -> list[tuple[str, float, float]]:
    """(label, batch-1 p50 ms, mean primary) of the full model in each precision and of every variant as served
    (the models not timed are left out)."""
    full = report.full
    points = []
    if full is not None and full.speed is not None:
        points += [(f"full ({p})", s.p50_ms, full.mean_primary) for p, s in full.speed.precisions().items()]
    for name, v in report.variants.items():
        if (s := v.served_speed()) is not None:
            points.append((name, s.p50_ms, v.mean_primary))
    return points


def pareto_front(points: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """The points no other point beats on both axes (faster and at least as accurate, or as fast and more accurate),
    fastest first: the models worth serving at some latency budget."""
    front: list[tuple[str, float, float]] = []
    for point in sorted(points, key=lambda p: (p[1], -p[2])):
        if not front or point[2] > front[-1][2]:
            front.append(point)
    return front


def plot_front(report: CompressionReport, path: Path) -> None:
    """Mean primary test metric against batch-1 p50 latency: every model on one plot, the servable ones' Pareto
    front drawn through them, a legend for the marks."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    points = front_points(report)
    servable = {label: label not in report.not_servable() for label, _, _ in points}
    front = pareto_front([p for p in points if servable[p[0]]])
    ax.step([ms for _, ms, _ in front], [100 * m for _, _, m in front], where="post", color="0.6", lw=1, zorder=1)
    for label, ms, mean in points:
        color = "C0" if label.startswith("full") else "C1"
        ax.scatter([ms], [100 * mean], s=60, marker="o" if servable[label] else "x", color=color, zorder=2)
        ax.annotate(label, (ms, 100 * mean), textcoords="offset points", xytext=(6, 4), fontsize=9)
    ax.margins(x=0.15, y=0.12)  # room for the labels at the edges
    marks = [
        Line2D([], [], ls="", marker="o", color="C0", label="full model"),
        Line2D([], [], ls="", marker="o", color="C1", label="variant"),
        Line2D([], [], ls="", marker="x", color="C1", label="variant below the accuracy floor (not served)"),
        Line2D([], [], color="0.6", lw=1, label="Pareto front: nothing faster is as accurate"),
    ]
    # outside the axes, on the right: inside it covered a point and its label (the fast, accurate corner is top left)
    ax.legend(handles=marks, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8)
    ax.set(
        title="accuracy vs latency (test, batch 1, serving code path)",
        xlabel="batch-1 p50 latency (ms)",
        ylabel="mean primary metric (%)",
    )
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")  # the legend and the edge labels inside the image
    plt.close(fig)


def compression_markdown(r: CompressionReport) -> str:
    """The front table, per-task deltas with CIs, and how each variant was built."""
    if r.full is None or r.machine is None or r.bootstrap is None:
        return "# Compression\n\n`compress.enabled` is false.\n"
    full, conf, m, int8 = r.full, r.bootstrap.confidence, r.machine, r.int8_backend
    tasks = list(full.tasks)
    lines = [
        "# Compression: what each variant costs and keeps",
        "",
        f"Machine: {m.cpu} ({', '.join(m.flags) or 'no bf16/int8 extensions'}), {m.threads} threads. "
        f"Latency and throughput through the serving code (`Predictor`), one fresh process per model; "
        f"non-INT8 models in `precision: {r.serving_precision}` as served, INT8 with fp32 activations"
        + (f" ({int8.engine}: {int8.reason})." if int8 else "."),
        "",
        "Speedup: the batch-1 p50 of the full model in its fastest precision over the variant's as served (a bf16 "
        "full model can answer slower than fp32 at batch 1). p50 / p95 and rows/s: as served; rounds: the "
        "p50 of each of the consecutive rounds of timed requests (the serving rule only counts a variant faster "
        "when its slowest round beats the full model's fastest).",
        "",
        to_markdown(front_view(r)),
    ]
    if noisy := noisy_timings(r):
        lines += ["", "**Timings measured on a busy machine: compare them with care.** " + "; ".join(noisy) + "."]
    lines += [
        "",
        f"## Per task: primary test metric and the paired bootstrap {conf:.0%} CI of (variant - full)",
        "",
        "| variant | " + " | ".join(f"{t} ({full.tasks[t].primary})" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
        "| full | " + " | ".join(f"{points(full.tasks[t].value)}" for t in tasks) + " |",
    ]
    for name, v in r.variants.items():
        cells = [
            f"{points(s.value)} ({points(s.delta, signed=True)} [{points(s.ci_low, signed=True)}, "
            f"{points(s.ci_high, signed=True)}])"
            for s in (v.tasks[t] for t in tasks)
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Share of test predictions identical to the full model's (label, tag sequence, answer span, label set):",
        "",
        "| variant | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for name, v in r.variants.items():
        same = [v.tasks[t].agreement for t in tasks]
        lines.append(f"| {name} | " + " | ".join("-" if a is None else f"{points(a)}%" for a in same) + " |")
    lines += ["", "## How each variant was built", ""]
    for name, v in r.variants.items():
        lines.append(f"- **{name}**: " + "; ".join(build_steps(v.build)))
    lines += ["", "![accuracy vs latency](compression/front.png)"]
    return "\n".join(lines) + "\n"


def build_steps(b: Build) -> list[str]:
    """How a variant was built, a phrase per step: its time, the student's layers, the heads kept, the training."""
    how = [f"{b.build_seconds} s"]
    if b.teacher_layers is not None:
        how.append(f"student layers {b.teacher_layers}")
    if b.heads is not None:
        kept = sum(len(h) for h in b.heads.values())
        how.append(f"{kept} heads kept per layer " + ", ".join(str(len(h)) for h in b.heads.values()))
    if b.steps is not None:
        how.append(f"{b.steps} steps, best dev mean primary {b.best_dev_mean_primary} at step {b.best_step}")
    return how
