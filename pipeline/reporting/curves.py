"""Reading the curve CSVs that ``pipeline.training.callbacks.CurveLogger`` writes (one file per kind of log)."""

from __future__ import annotations

import csv
from pathlib import Path


def read_curves(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Column -> [(step, value)] of one curve CSV (``train.csv``, ``eval.csv``, ``dev.csv``); empty when it is missing."""
    series: dict[str, list[tuple[int, float]]] = {}
    if not path.exists():
        return series
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key != "step":
                    series.setdefault(key, []).append((int(row["step"]), float(value)))
    return series


def column(path: Path, name: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of one column of a curve CSV (empty lists when the file or column is missing)."""
    points = read_curves(path).get(name, [])
    return [step for step, _ in points], [value for _, value in points]
