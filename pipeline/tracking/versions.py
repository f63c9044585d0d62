"""What a registered version says: its tags from the test metrics and compression report, and the full model
and servable variants as candidates for the serving rule (:func:`pipeline.tracking.promotion.choose_served`).

Pure functions of ``reports/metrics.json`` and ``reports/compression.json``: no MLflow call here.
"""

from __future__ import annotations

from typing import Any

from pipeline.reporting.numbers import points
from pipeline.reporting.timing import p50_range
from pipeline.tracking.promotion import Candidate


def variant_metrics(metrics: dict[str, Any], compression: dict[str, Any], name: str) -> dict[str, Any]:
    """A ``reports/metrics.json``-shaped view of a variant's test metrics (for its version tags)."""
    variant = compression["variants"][name]
    tasks = {}
    for task, t in metrics["tasks"].items():
        entry = variant["tasks"][task]
        tasks[task] = {"primary": t["primary"], "trivial": t["trivial"], "adapted": entry["metrics"]}
        if "value_ci" in entry:
            tasks[task]["primary_ci"] = {"adapted": entry["value_ci"]}
    return {"tasks": tasks, "summary": {"mean_primary_adapted": variant["mean_primary"]}}


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


def version_description(name: str, shown: dict[str, Any], entry: dict[str, Any], parent: str | None) -> str:
    """The one line a person reads on the version's page: what it is, how good, what it costs.

    ``shown``: its metrics.json-shaped test metrics; ``entry``: its compression.json entry (empty without one).
    """
    what = "full model" if parent is None else f"{name} of version {parent}"
    primaries = ", ".join(
        f"{task}.{t['primary']} {points(t['adapted'][t['primary']])}" for task, t in shown["tasks"].items()
    )
    mean = shown["summary"]["mean_primary_adapted"]
    against = f" ({points(entry['mean_primary_delta'], signed=True)} vs full)" if "mean_primary_delta" in entry else ""
    text = f"{what}: mean primary {points(mean)} points{against}; {primaries}"
    if entry.get("size_mb") is not None:
        text += f"; {float(entry['size_mb']):.1f} MB"
    if (p50 := served_p50(entry)) is not None:
        text += f", batch-1 p50 {p50:.1f} ms ({entry['served_in']})"
    return text


def serving_candidates(metrics: dict[str, Any], compression: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The full model and the servable variants as :class:`pipeline.tracking.promotion.Candidate`."""
    full_primary = {t: float(v["adapted"][v["primary"]]) for t, v in metrics["tasks"].items()}
    full = Candidate(
        "full",
        float(metrics["summary"]["mean_primary_adapted"]),
        full_primary,
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
