"""What a registered version says: its tags from the test metrics and compression report, and the full model
and servable variants as candidates for the serving rule (:func:`pipeline.tracking.gate.choose_served`).

Pure functions of ``reports/metrics.json`` (:class:`EvaluationReport`) and ``reports/compression.json``: no MLflow call here.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.reports.compression import CompressionReport, ModelEntry, VariantEntry
from pipeline.core.reports.evaluation import EvaluationReport, ServedTask, VersionScores
from pipeline.reporting.numbers import points
from pipeline.tracking.gate import Candidate


def variant_scores(report: EvaluationReport, compression: CompressionReport, name: str) -> VersionScores:
    """A compressed variant's test scores (compression.json's entry), per task beside the task's trivial baseline."""
    variant = compression.variants[name]
    tasks = {}
    for task, t in report.tasks.items():
        entry = variant.tasks[task]
        low, high = entry.value_ci
        tasks[task] = ServedTask(t.primary, dict(entry.metrics), t.trivial, (low, high))
    return VersionScores(tasks, variant.mean_primary)


def served_p50(entry: ModelEntry | None) -> float | None:
    """Batch-1 p50 latency (ms) of a model in the precision it is served in; None where it was not timed."""
    speed = None if entry is None else entry.served_speed()
    return None if speed is None else speed.p50_ms


def compression_tags(entry: ModelEntry | None, name: str, parent: str | None) -> dict[str, str]:
    """The handful of tags that say what a variant is and what it costs."""
    tags = {"variant": name}
    if parent is not None:
        tags["parent_version"] = parent
    if entry is not None:
        tags["compression.size_mb"] = str(entry.size_mb)
        if (p50 := served_p50(entry)) is not None:  # in the precision it is served in (the description names it)
            tags["compression.p50_ms"] = str(p50)
        if isinstance(entry, VariantEntry):
            tags["compression.mean_primary_delta"] = repr(float(entry.mean_primary_delta))
    return tags


def version_description(name: str, shown: VersionScores, entry: ModelEntry | None, parent: str | None) -> str:
    """The one line a person reads on the version's page: what it is, how good, what it costs.

    ``shown``: its test scores; ``entry``: what compress measured of it (None without compression).
    """
    what = "full model" if parent is None else f"{name} of version {parent}"
    primaries = ", ".join(f"{task}.{t.primary} {points(t.score)}" for task, t in shown.tasks.items())
    mean = shown.mean_primary
    against = f" ({points(entry.mean_primary_delta, signed=True)} vs full)" if isinstance(entry, VariantEntry) else ""
    text = f"{what}: mean primary {points(mean)} points{against}; {primaries}"
    if entry is not None:
        text += f"; {entry.size_mb:.1f} MB"
        if (p50 := served_p50(entry)) is not None:
            text += f", batch-1 p50 {p50:.1f} ms ({entry.served_in})"
    return text


def serving_candidates(report: EvaluationReport, compression: CompressionReport) -> tuple[Any, list[Any]]:
    """The full model and the servable variants as :class:`pipeline.tracking.gate.Candidate`."""
    full_scores = report.version_scores()
    timed = compression.full.served_speed() if compression.full else None
    full = Candidate(
        "full",
        full_scores.mean_primary,
        {t: v.score for t, v in full_scores.tasks.items()},
        None if timed is None else timed.p50_ms,
        None if timed is None else timed.p50_range,
    )
    variants = []
    for name, v in compression.servable().items():
        speed = v.served_speed()
        variants.append(
            Candidate(
                name,
                v.mean_primary,
                {t: x.value for t, x in v.tasks.items()},
                None if speed is None else speed.p50_ms,
                None if speed is None else speed.p50_range,
            )
        )
    return full, variants
