"""Whether measured latencies can be taken at face value: the machine's load and the agreement of the timed rounds
(``pipeline.serving.speed`` records both per model and precision). Pure: compress, the reports and the serving rule
read it."""

from __future__ import annotations

from pipeline.core.reports.compression import PrecisionSpeed

NOISY_SPREAD = 0.25  # rounds' p50s further apart than this fraction of the p50: the timings are noisy


def timing_noise(s: PrecisionSpeed) -> str | None:
    """Why the latencies of one precision of a speed measurement are noisy (a load average above the cores the
    process could use, or round p50s that disagree by more than :data:`NOISY_SPREAD`), or None when they look steady.
    Timings measured before rounds were recorded are taken as they are."""
    problems = []
    if s.load_1m is not None and s.cores and s.load_1m > s.cores:
        problems.append(f"load average {s.load_1m:.1f} on {s.cores} cores")
    low_high = s.p50_range
    if low_high and s.p50_ms and (low_high[1] - low_high[0]) / s.p50_ms > NOISY_SPREAD:
        problems.append(f"rounds' p50 {low_high[0]:.1f}-{low_high[1]:.1f} ms")
    return "; ".join(problems) or None


def rounds_text(s: PrecisionSpeed | None) -> str | None:
    """``8.1-9.0`` (ms): the spread of the rounds' p50s, for a table cell."""
    low_high = None if s is None else s.p50_range
    return None if low_high is None else f"{low_high[0]:.1f}-{low_high[1]:.1f}"
