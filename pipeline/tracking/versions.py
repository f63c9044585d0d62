"""What a registered version says: its tags from the test metrics and compression report, and the full model
and servable variants as candidates for the serving rule (:func:`pipeline.tracking.promotion.choose_served`).

Pure functions of ``reports/metrics.json`` (:class:`EvaluationReport`) and ``reports/compression.json``: no MLflow call here.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.reports.evaluation import EvaluationReport, ServedTask, VersionScores
from pipeline.reporting.numbers import points
from pipeline.reporting.timing import p50_range
from pipeline.tracking.promotion import Candidate


def variant_scores(report: EvaluationReport, compression: dict[str, Any], name: str) -> VersionScores:
    """A compressed variant's test scores (compression.json's entry), per task beside the task's trivial baseline."""
    variant = compression["variants"][name]
    tasks = {}
    for task, t in report.tasks.items():
        entry = variant["tasks"][task]
        ci = entry.get("value_ci")
        tasks[task] = ServedTask(t.primary, entry["metrics"], t.trivial, (ci[0], ci[1]) if ci else None)
    return VersionScores(tasks, float(variant["mean_primary"]))


def served_speed(entry: dict[str, Any]) -> dict[str, Any]:
    """The speed of a compression.json model entry in the precision it is served in ({} when not measured)."""
    return entry.get("speed", {}).get(entry.get("served_in", ""), {})


def served_p50(entry: dict[str, Any]) -> float | None:
    """Batch-1 p50 latency (ms) of a compression.json model entry in the precision it is served in."""
    return served_speed(entry).get("p50_ms")


def compression_tags(entry: dict[str, Any], name: str, parent: str | None) -> dict[str, str]:
    """The handful of tags that say what a variant is and what it costs."""
    tags = {"variant": name}
    if parent is not None:
        tags["parent_version"] = parent
    if entry:
        tags["compression.size_mb"] = str(entry["size_mb"])
        if served_p50(entry) is not None:  # in the precision it is served in (the description names it)
            tags["compression.p50_ms"] = str(served_p50(entry))
        if "mean_primary_delta" in entry:
            tags["compression.mean_primary_delta"] = repr(float(entry["mean_primary_delta"]))
    return tags


def version_description(name: str, shown: VersionScores, entry: dict[str, Any], parent: str | None) -> str:
    """The one line a person reads on the version's page: what it is, how good, what it costs.

    ``shown``: its test scores; ``entry``: its compression.json entry (empty without one).
    """
    what = "full model" if parent is None else f"{name} of version {parent}"
    primaries = ", ".join(f"{task}.{t.primary} {points(t.score)}" for task, t in shown.tasks.items())
    mean = shown.mean_primary
    against = f" ({points(entry['mean_primary_delta'], signed=True)} vs full)" if "mean_primary_delta" in entry else ""
    text = f"{what}: mean primary {points(mean)} points{against}; {primaries}"
    if entry.get("size_mb") is not None:
        text += f"; {float(entry['size_mb']):.1f} MB"
    if (p50 := served_p50(entry)) is not None:
        text += f", batch-1 p50 {p50:.1f} ms ({entry['served_in']})"
    return text


def serving_candidates(report: EvaluationReport, compression: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The full model and the servable variants as :class:`pipeline.tracking.promotion.Candidate`."""
    full_scores = report.version_scores()
    full = Candidate(
        "full",
        full_scores.mean_primary,
        {t: v.score for t, v in full_scores.tasks.items()},
        served_p50(compression.get("full", {})),
        p50_range(served_speed(compression.get("full", {}))),
    )
    variants = [
        Candidate(
            name,
            float(v["mean_primary"]),
            {t: float(x["value"]) for t, x in v["tasks"].items()},
            served_p50(v),
            p50_range(served_speed(v)),
        )
        for name, v in compression.get("variants", {}).items()
        if v.get("servable")
    ]
    return full, variants
