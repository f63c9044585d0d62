"""The compression report: the accuracy/latency front (plot) and compression.md, from reports/compression.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.reporting.numbers import points
from pipeline.reporting.tables import front_view, to_markdown
from pipeline.reporting.timing import timing_noise


def noisy_timings(report: dict[str, Any]) -> list[str]:
    """``model (precision): why`` for every timing of the report that is not to be taken at face value."""
    models = {"full": report["full"], **report["variants"]}
    return [
        f"{name} ({p}): {why}"
        for name, entry in models.items()
        for p, s in entry.get("speed", {}).items()
        if isinstance(s, dict) and (why := timing_noise(s))
    ]


def front_points(report: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(label, batch-1 p50 ms, mean primary) of the full model in each precision and of every variant as served."""
    full = report["full"]
    points = [
        (f"full ({p})", full["speed"][p]["p50_ms"], full["mean_primary"])
        for p in ("fp32", "bf16")
        if p in full["speed"]
    ]
    for name, v in report["variants"].items():
        points.append((name, v["speed"][v["served_in"]]["p50_ms"], v["mean_primary"]))
    return points


def pareto_front(points: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """The points no other point beats on both axes (faster and at least as accurate, or as fast and more accurate),
    fastest first: the models worth serving at some latency budget."""
    front: list[tuple[str, float, float]] = []
    for point in sorted(points, key=lambda p: (p[1], -p[2])):
        if not front or point[2] > front[-1][2]:
            front.append(point)
    return front


def plot_front(report: dict[str, Any], path: Path) -> None:
    """Mean primary test metric against batch-1 p50 latency: every model on one plot, the servable ones' Pareto
    front drawn through them, a legend for the marks."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    points = front_points(report)
    servable = {label: report["variants"].get(label, {}).get("servable", True) for label, _, _ in points}
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


def compression_markdown(r: dict[str, Any]) -> str:
    """The front table, per-task deltas with CIs, and how each variant was built."""
    full, conf = r["full"], r["bootstrap"]["confidence"]
    m = r["machine"]
    tasks = list(full["tasks"])
    lines = [
        "# Compression: what each variant costs and keeps",
        "",
        f"Machine: {m['cpu']} ({', '.join(m['flags']) or 'no bf16/int8 extensions'}), {m['threads']} threads. "
        f"Latency and throughput through the serving code (`Predictor`), one fresh process per model; "
        f"non-INT8 models in `precision: {r['serving_precision']}` as served, INT8 with fp32 activations"
        + (f" ({r['int8_backend']['engine']}: {r['int8_backend']['reason']})." if r["int8_backend"] else "."),
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
        "| variant | " + " | ".join(f"{t} ({full['tasks'][t]['primary']})" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
        "| full | " + " | ".join(f"{points(full['tasks'][t]['value'])}" for t in tasks) + " |",
    ]
    for name, v in r["variants"].items():
        cells = [
            f"{points(v['tasks'][t]['value'])} ({points(v['tasks'][t]['delta'], signed=True)} [{points(v['tasks'][t]['ci_low'], signed=True)}, "
            f"{points(v['tasks'][t]['ci_high'], signed=True)}])"
            for t in tasks
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Share of test predictions identical to the full model's (label, tag sequence, answer span, label set):",
        "",
        "| variant | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for name, v in r["variants"].items():
        same = [v["tasks"][t].get("agreement") for t in tasks]
        lines.append(f"| {name} | " + " | ".join("-" if a is None else f"{points(a)}%" for a in same) + " |")
    lines += ["", "## How each variant was built", ""]
    for name, v in r["variants"].items():
        b = v["build"]
        how = [f"{b['build_seconds']} s"]
        if b.get("teacher_layers") is not None:
            how.append(f"student layers {b['teacher_layers']}")
        if b.get("heads") is not None:
            kept = sum(len(h) for h in b["heads"].values())
            how.append(f"{kept} heads kept per layer " + ", ".join(str(len(h)) for h in b["heads"].values()))
        if "steps" in b:
            how.append(
                f"{b['steps']} steps, best dev mean primary {b['best_dev_mean_primary']} at step {b['best_step']}"
            )
        lines.append(f"- **{name}**: " + "; ".join(how))
    lines += ["", "![accuracy vs latency](compression/front.png)"]
    return "\n".join(lines) + "\n"
