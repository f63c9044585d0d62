"""Small typed stage reports for the unit tests (compression, promotion): every field the type requires, the rest as
asked."""

from __future__ import annotations

from typing import Any

from pipeline.core.reports.compression import (
    Build,
    CompressionReport,
    FullEntry,
    PrecisionSpeed,
    Speed,
    TaskScore,
    VariantEntry,
    VariantTaskScore,
)
from pipeline.core.reports.promotion import PromotionReport, Serving


def timing(p50_ms: float, **fields: Any) -> PrecisionSpeed:
    """One precision's timing: ``p50_ms``, the other fields as given or plausible."""
    defaults = {"p95_ms": p50_ms * 1.2, "throughput_rows_per_s": 100.0, "load_s": 0.5}
    return PrecisionSpeed(p50_ms=p50_ms, **(defaults | fields))


def speed(peak_rss_mb: float = 800.0, **precisions: PrecisionSpeed) -> Speed:
    """A model's speed measured in ``precisions`` (fp32=..., bf16=...)."""
    return Speed(threads=2, rss_before_load_mb=100.0, peak_rss_mb=peak_rss_mb, **precisions)


def full(mean_primary: float = 0.8, size_mb: float = 90.0, speed: Speed | None = None, **fields: Any) -> FullEntry:
    """The full model's entry, one task ``role`` at ``mean_primary``."""
    tasks = {"role": TaskScore(primary="macro_f1", value=mean_primary)}
    timed = {} if speed is None else {"speed": speed}
    return FullEntry(mean_primary=mean_primary, tasks=tasks, size_mb=size_mb, served_in="fp32", **timed, **fields)


def variant(
    mean_primary: float = 0.8,
    delta: float = 0.0,
    size_mb: float = 60.0,
    speed: Speed | None = None,
    servable: bool = True,
    **fields: Any,
) -> VariantEntry:
    """A variant's entry, one task ``role`` at ``mean_primary`` with a CI of +-0.01 around ``delta``."""
    task = VariantTaskScore(
        primary="macro_f1",
        value=mean_primary,
        value_ci=[mean_primary - 0.02, mean_primary + 0.02],
        agreement=0.95,
        delta=delta,
        ci_low=delta - 0.01,
        ci_high=delta + 0.01,
        metrics={"macro_f1": mean_primary},
    )
    return VariantEntry(
        tasks={"role": task},
        mean_primary=mean_primary,
        mean_primary_delta=delta,
        size_mb=size_mb,
        build=Build(teacher_layers=None, heads=None),
        served_in=fields.pop("served_in", "fp32"),
        size_ratio=1.5,
        servable=servable,
        floor=fields.pop("floor", "within compress.accuracy_floor"),
        **({} if speed is None else {"speed": speed}),
        **fields,
    )


def report(full_entry: FullEntry, **variants: VariantEntry) -> CompressionReport:
    """An enabled compression report of ``full_entry`` and ``variants``."""
    return CompressionReport(enabled=True, full=full_entry, variants=variants)


def promotion(**fields: Any) -> PromotionReport:
    """A register stage's report: version 3 of ``adaptbert``, the full model served, no champion before; ``fields``
    replace any of it."""
    defaults: dict[str, Any] = {
        "model_name": "adaptbert",
        "profile": None,
        "version": "3",
        "model_uri": "models:/adaptbert/3",
        "run_id": "r",
        "parent_run_id": "p",
        "experiment_id": "1",
        "tracking_uri": "sqlite:///mlflow.db",
        "fill_mask_model_uri": None,
        "versions": {"full": "3"},
        "serving": Serving(choice="full", reason="-", rule={}, candidates=[]),
        "not_registered": {},
        "promoted": True,
        "reason": "promoted: no champion yet and every task clears its floor",
        "champion_before": None,
        "champion_after": "3",
        "mean_primary_challenger": 0.83,
        "mean_primary_champion": None,
        "table": [],
        "rules": {},
    }
    return PromotionReport(**(defaults | fields))
