"""Whether measured latencies can be taken at face value: the machine's load and the agreement of the timed rounds
(``pipeline.serving.speed`` records both per model and precision). Pure: compress, the reports and the serving rule
read it."""

from __future__ import annotations

from typing import Any

NOISY_SPREAD = 0.25  # rounds' p50s further apart than this fraction of the p50: the timings are noisy


def timing_noise(s: dict[str, Any]) -> str | None:
    """Why the latencies of one precision entry of a speed measurement are noisy (a load average above the cores the
    process could use, or round p50s that disagree by more than :data:`NOISY_SPREAD`), or None when they look steady.
    Entries measured before rounds were recorded are taken as they are."""
    problems = []
    if s.get("load_1m") is not None and s.get("cores") and s["load_1m"] > s["cores"]:
        problems.append(f"load average {s['load_1m']:.1f} on {s['cores']} cores")
    low_high = p50_range(s)
    if low_high and s.get("p50_ms") and (low_high[1] - low_high[0]) / s["p50_ms"] > NOISY_SPREAD:
        problems.append(f"rounds' p50 {low_high[0]:.1f}-{low_high[1]:.1f} ms")
    return "; ".join(problems) or None


def p50_range(s: dict[str, Any]) -> tuple[float, float] | None:
    """The lowest and highest round p50 (ms) of a precision entry; None for timings without rounds."""
    rounds = s.get("p50_rounds_ms")
    return (float(min(rounds)), float(max(rounds))) if rounds else None


def rounds_text(s: dict[str, Any]) -> str | None:
    """``8.1-9.0`` (ms): the spread of the rounds' p50s, for a table cell."""
    low_high = p50_range(s)
    return None if low_high is None else f"{low_high[0]:.1f}-{low_high[1]:.1f}"
