"""One rounding of a metric as points wherever a person reads it (issue 63, item 3 of its "why")."""

from __future__ import annotations

import json

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
    assert "adapted 82.0, baseline 78.6, gain +3.4\n" in note and "| role | 83.8 |" in note
    assert [cell(0.8195, "pct"), cell(0.7855, "pct"), cell(0.034, "points")] == ["82.0", "78.6", "+3.4"]
    assert cell((-0.012, 0.0335), "ci") == points_interval(-0.012, 0.0335) == "[-1.2, +3.4]"


def test_the_headline_is_one_string_in_the_report_the_note_the_history_and_the_console() -> None:
    """The committed run's adapted, baseline, gain and CI, read from metrics.json's digits everywhere: summary.json's
    four places could round a tenth apart (0.78549 reads 78.5, its 0.7855 78.6), so the MLflow note and ``adaptbert
    history`` take evaluate's numbers (its stage run's metrics) as the run report and the console do."""
    from html import escape

    from pipeline.core.config import load_config
    from pipeline.core.io import read_report
    from pipeline.core.paths import Paths
    from pipeline.core.reports.evaluation import EvaluationReport
    from pipeline.core.reports.promotion import Serving
    from pipeline.reporting.headline import execution_headline, headline, summary_headline
    from pipeline.reporting.html import headline_section
    from pipeline.stages.evaluate import summary as evaluate_console
    from tests.conftest import ROOT
    from tests.unit import typed_reports as c

    metrics = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
    summary = json.loads((ROOT / "reports" / "summary.json").read_text())
    s = metrics.summary
    shown = summary_headline(s)
    assert s.gain_interval is not None
    low, high = s.gain_interval
    assert shown == f"adapted {points(s.mean_primary_adapted)}, baseline {points(s.mean_primary_baseline)}, " + (
        f"gain {points(s.mean_primary_delta, signed=True)} {points_interval(low, high)}"
    )
    assert f"Mean primary test metric (points): {escape(shown)}</p>" in headline_section(metrics)
    served = c.promotion(serving=Serving(choice="int8", reason="-", rule={}, candidates=[]), promoted=True)
    assert headline(metrics, served) == summary  # the note's numbers
    assert f"**Mean primary test metric** (points): {shown}\n" in headline_markdown(summary, [], s)
    logged = {
        f"summary.{k}": v for k, v in s.as_json().items()
    }  # the evaluate stage run's metrics (its report's summary.*)
    row = {
        "adapted": logged["summary.mean_primary_adapted"],
        "baseline": logged["summary.mean_primary_baseline"],
        "gain": logged["summary.mean_primary_delta"],
        "gain_low": logged["summary.mean_primary_delta_low"],
        "gain_high": logged["summary.mean_primary_delta_high"],
    }
    assert execution_headline(row) == shown  # adaptbert history's cell
    assert points(0.78549) == "78.5" != points(round(0.78549, 4))  # why summary.json's digits are not read
    console = evaluate_console(metrics, load_config(ROOT / "params.yaml"), Paths(ROOT))
    assert f"mean primary: {shown}; report:" in console
