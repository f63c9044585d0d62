"""The one way a metric reads as points, wherever a person reads it (run report, MLflow note, model card, console,
``adaptbert history`` and ``models list``): a fraction times 100 with one decimal, rounded half up from the digits
the reports store. ``f"{100 * x:.1f}"`` reads 0.8195 as 81.9 and 0.7855 as 78.5 (the binary floats sit just below
their decimal halves) while ``dvc metrics show`` prints 0.8195 and 0.7855; here they read 82.0 and 78.6 everywhere.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

TENTH = Decimal("0.1")


def points(value: Any, signed: bool = False) -> str:
    """``0.8195`` -> ``82.0`` (``+82.0`` when ``signed``); ``-`` for a missing value; never ``-0.0``."""
    if value is None or value == "":
        return "-"
    scaled = (Decimal(repr(float(value))) * 100).quantize(TENTH, rounding=ROUND_HALF_UP)
    if scaled == 0:
        scaled = abs(scaled)
    return f"{scaled:+.1f}" if signed else f"{scaled:.1f}"


def points_interval(low: Any, high: Any) -> str:
    """``[-1.2, +3.4]``: an interval of differences in points."""
    return f"[{points(low, signed=True)}, {points(high, signed=True)}]"
