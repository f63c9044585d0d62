"""One rounding of a metric as points wherever a person reads it (issue 63, item 3 of its "why")."""

from __future__ import annotations

import pytest

from pipeline.reporting.headline import headline_markdown
from pipeline.reporting.numbers import points, points_interval
from pipeline.reporting.tables import cell


@pytest.mark.parametrize(
    ("value", "plain", "signed"),
    [
        (0.8195, "82.0", "+82.0"),  # f"{100 * x:.1f}" read 81.9: the float sits just below 81.95
        (0.7855, "78.6", "+78.6"),  # and 78.5
        (0.0447, "4.5", "+4.5"),
        (-0.0125, "-1.3", "-1.3"),  # half up in magnitude, as dvc metrics show's digits read
        (-0.0004, "0.0", "+0.0"),  # never -0.0
        (None, "-", "-"),
    ],
)
def test_a_fraction_reads_as_points_rounded_half_up_from_its_digits(value, plain, signed) -> None:
    assert points(value) == plain and points(value, signed=True) == signed


def test_the_report_tables_and_the_mlflow_note_read_the_same_headline() -> None:
    """The committed demo run's 0.8195 / 0.7855 read 81.9 / 78.6 in the report cards, 82.0 / 78.5 in the MLflow note."""
    summary = {"adapted": 0.8195, "baseline": 0.7855, "gain": 0.034, "served": "int8", "promoted": True, "role": 0.8375}
    note = headline_markdown(summary)
    assert "adapted 82.0, baseline 78.6 (+3.4 points" in note and "| role | 83.8 |" in note
    assert [cell(0.8195, "pct"), cell(0.7855, "pct"), cell(0.034, "points")] == ["82.0", "78.6", "+3.4"]
    assert cell((-0.012, 0.0335), "ci") == points_interval(-0.012, 0.0335) == "[-1.2, +3.4]"
