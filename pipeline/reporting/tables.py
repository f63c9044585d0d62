"""A report's table built once, rendered per medium: markdown (evaluation.md, compression.md), HTML (the run
report), records (Prefect table artifacts, benchmark rows).

A view is a function of a stage report that returns a :class:`Table`: its columns (key, title, how a value
reads) and its rows (raw values). The renderers only format: no medium decides what a row holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.core.reports.adapt import AdaptReport
from pipeline.core.reports.compression import CompressionReport, PrecisionSpeed
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.sections.adapt import ARM_NAMES
from pipeline.reporting.numbers import points, points_interval
from pipeline.reporting.timing import rounds_text

Kind = Literal["text", "pct", "points", "ci", "ms", "mb", "count"]


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    kind: Kind = "text"


@dataclass(frozen=True)
class Table:
    columns: tuple[Column, ...]
    rows: list[dict[str, Any]]
    styles: list[dict[str, str]] = field(default_factory=list)  # per row: column key -> "good" | "bad" (HTML only)


def cell(value: Any, kind: Kind) -> str:
    """A value as it reads in a table: fractions as percent, deltas as signed points, ``-`` where missing."""
    if value is None or value == "":
        return "-"
    if kind == "pct":
        return points(value)
    if kind == "points":
        return points(value, signed=True)
    if kind == "ci":
        low, high = value
        return points_interval(low, high)
    if kind == "ms":
        return f"{float(value):.2f}"
    if kind == "mb":
        return f"{float(value):.1f}"
    if kind == "count":
        return f"{float(value):.0f}"
    return str(value)


def to_markdown(table: Table) -> str:
    """A GitHub-flavoured markdown table (no trailing newline)."""
    lines = [
        "| " + " | ".join(c.title for c in table.columns) + " |",
        "|" + "---|" * len(table.columns),
    ]
    lines += ["| " + " | ".join(cell(row.get(c.key), c.kind) for c in table.columns) + " |" for row in table.rows]
    return "\n".join(lines)


def to_records(table: Table) -> list[dict[str, Any]]:
    """The rows as raw values keyed by column (Prefect table artifacts, benchmark JSON); an interval is two
    keys, ``<key>_low`` and ``<key>_high``."""
    records = []
    for row in table.rows:
        record: dict[str, Any] = {}
        for c in table.columns:
            value = row.get(c.key)
            if c.kind == "ci":
                record[f"{c.key}_low"], record[f"{c.key}_high"] = value if value is not None else (None, None)
            else:
                record[c.key] = value
        records.append(record)
    return records


# ----------------------------------------------------------------------------- the views


def dapt_view(metrics: EvaluationReport) -> Table:
    """reports/metrics.json: per task the primary metric of trivial, baseline and adapted, the delta and its CI;
    then the means."""
    columns = (
        Column("task", "task"),
        Column("type", "type"),
        Column("primary", "primary"),
        Column("trivial", "trivial", "pct"),
        Column("trivial_baseline", "trivial is"),
        Column("baseline", "baseline", "pct"),
        Column("adapted", "adapted", "pct"),
        Column("delta", "delta (points)", "points"),
        Column("ci", f"{metrics.bootstrap.confidence:.0%} CI", "ci"),
    )
    rows, styles = [], []
    for task, t in metrics.tasks.items():
        gain = t.gain
        ci = gain[1:] if gain else None
        rows.append(
            {
                "task": task,
                "type": t.type,
                "primary": t.primary,
                "trivial": t.score("trivial"),
                "trivial_baseline": t.trivial_baseline,
                "baseline": t.score("baseline"),
                "adapted": t.score("adapted"),
                "delta": t.delta,
                "ci": ci,
            }
        )
        styles.append(gain_style(t.delta, ci))
    s = metrics.summary
    rows.append(
        {
            "task": "mean",
            "trivial": s.mean_primary_trivial,
            "baseline": s.mean_primary_baseline,
            "adapted": s.mean_primary_adapted,
            "delta": s.mean_primary_delta,
            "ci": s.gain_interval,
        }
    )
    styles.append(gain_style(s.mean_primary_delta, s.gain_interval))
    return Table(columns, rows, styles)


def gain_style(delta: float | None, ci: tuple[float, float] | None) -> dict[str, str]:
    """A gain's cell style: good or bad where its interval excludes 0, none where it does not (or there is none)."""
    if ci is None or not (ci[0] > 0 or ci[1] < 0):
        return {}
    return {"delta": "good" if (delta or 0) > 0 else "bad"}


def front_view(report: CompressionReport) -> Table:
    """reports/compression.json: the full model in each measured precision, then every variant as served."""
    columns = (
        Column("model", "model"),
        Column("size_mb", "size MB", "mb"),
        Column("peak_rss_mb", "peak RSS MB", "count"),
        Column("p50_ms", "batch-1 p50 ms", "ms"),
        Column("p95_ms", "batch-1 p95 ms", "ms"),
        Column("rounds", "p50 of rounds ms"),
        Column("speedup", "speedup vs the fastest full"),
        Column("rows_per_s", "batch rows/s", "count"),
        Column("mean_primary", "mean primary", "pct"),
        Column("delta", "delta (points)", "points"),
        Column("servable", "servable"),
    )
    rows = []
    if (full := report.full) is not None:
        # timings are absent from a committed report (they live in reports/measured/): one row without them
        timed: list[tuple[str | None, PrecisionSpeed | None]] = (
            list(full.speed.precisions().items()) if full.speed else []
        )
        for p, s in timed or [(None, None)]:
            rows.append(
                {
                    "model": f"full ({p})" if p else "full",
                    "size_mb": full.size_mb,
                    "peak_rss_mb": full.speed.peak_rss_mb if full.speed else None,
                    "p50_ms": s.p50_ms if s else None,
                    "p95_ms": s.p95_ms if s else None,
                    "rounds": rounds_text(s),
                    "rows_per_s": s.throughput_rows_per_s if s else None,
                    "mean_primary": full.mean_primary,
                    "delta": 0.0,
                    "servable": "yes",
                }
            )
    for name, v in report.variants.items():
        s, up = v.served_speed(), v.speedup_vs_fastest_full
        rows.append(
            {
                "model": f"{name} ({v.served_in})",
                "size_mb": v.size_mb,
                "peak_rss_mb": v.speed.peak_rss_mb if v.speed else None,
                "p50_ms": s.p50_ms if s else None,
                "p95_ms": s.p95_ms if s else None,
                "rounds": rounds_text(s),
                "speedup": f"{up:.2f}x" if up else None,
                "rows_per_s": s.throughput_rows_per_s if s else None,
                "mean_primary": v.mean_primary,
                "delta": v.mean_primary_delta,
                "servable": "yes" if v.servable else f"no: {v.floor}",
            }
        )
    return Table(columns, rows)


def adaptation_view(report: AdaptReport) -> Table:
    """The adapt stage's tournament (``reports/adapt.json`` under ``adapt.strategy: auto``): a row per arm and rung,
    its adaptation minutes, fine-tuning steps, minutes spent, dev mean and per-task dev primary metric."""
    rungs = report.rungs or []
    tasks = list(next(iter(rungs[0].arms.values())).dev) if rungs else []
    columns = (
        Column("rung", "rung"),
        Column("arm", "arm"),
        Column("adaptation", "adaptation min"),
        Column("steps", "fine-tuning steps", "count"),
        Column("minutes", "minutes"),
        Column("dev_mean", "dev mean", "pct"),
        *(Column(f"task:{t}", t, "pct") for t in tasks),
    )
    rows = [
        {
            "rung": rung.rung + 1,
            "arm": ARM_NAMES.get(arm, arm) + (" (chosen)" if rung is rungs[-1] and arm == report.chosen else ""),
            "adaptation": 0 if arm == "none" else rung.pretrain_minutes,
            "steps": rung.finetune_steps + (e.extra_steps or 0),
            "minutes": e.minutes,
            "dev_mean": e.dev_mean,
            **{f"task:{t}": e.dev[t] for t in tasks},
        }
        for rung in rungs
        for arm, e in rung.arms.items()
    ]
    return Table(columns, rows)
