"""The verdict in short lines, and the watch lines computed from the predictions (issue 63, item 5)."""

from __future__ import annotations

import pytest

from pipeline.core.io import read_report
from pipeline.core.reports.base import ReportError
from pipeline.core.reports.evaluation import EvaluationReport, EvaluationSummary, TaskEvaluation
from pipeline.core.reports.finetune import BaselineBudget, FinetuneReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.reporting.evaluation import verdict, watch
from pipeline.reporting.headline import SYNTHETIC, gate_reason, verdict_and_watch
from tests.conftest import ROOT


def _task(
    primary: str, adapted: float, baseline: float, trivial: float, delta_ci: tuple[float, float], **more: dict
) -> TaskEvaluation:
    """A task's test metrics (``more``: other metrics of the adapted model, e.g. ``per_type``)."""
    low, high = delta_ci
    return TaskEvaluation(
        type="sequence_classification",
        primary=primary,
        test_examples=200,
        trivial_baseline="majority class",
        trivial={primary: trivial},
        adapted={primary: adapted, **more},
        baseline={primary: baseline},
        primary_ci={},
        delta=adapted - baseline,
        ci_low=low,
        ci_high=high,
    )


RESULTS = {
    "ner": _task("f1", 1.0, 0.89, 0.0, (0.067, 0.13)),
    "pair": _task("macro_f1", 0.612, 0.582, 0.162, (-0.013, 0.075)),
    "role": _task("macro_f1", 0.79, 0.838, 0.079, (-0.08, -0.01)),
    "qa": _task("f1", 0.05, 0.05, 0.045, (-0.01, 0.01)),
}
EXTRAS = {  # pair: gold rows entailment 60, contradiction 69, neutral 71; nothing predicted as contradiction
    "pair": {
        "labels": ["entailment", "contradiction", "neutral"],
        "confusion": {
            "adapted": [[50, 0, 10], [60, 0, 9], [11, 0, 60]],
            "baseline": [[50, 5, 5], [9, 50, 10], [1, 2, 68]],
        },
    }
}
SUMMARY = EvaluationSummary(
    mean_primary_adapted=0.613,
    mean_primary_baseline=0.59,
    mean_primary_delta=0.023,
    mean_primary_delta_low=0.004,
    mean_primary_delta_high=0.041,
    perplexity_base=None,
    perplexity_adapted=None,
)
COMMITTED = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
PRE = read_report(ROOT / "reports" / "pretrain.json", PretrainReport).model_copy(
    update={"global_step": 300, "tokens_seen": 614346, "task_text_blocks": 0}
)
FINE = read_report(ROOT / "reports" / "finetune.json", FinetuneReport)  # the same steps, no search


def test_the_verdict_is_two_short_lines_the_gain_then_which_tasks_are_clear() -> None:
    lines = verdict(RESULTS, SUMMARY, PRE, FINE)
    assert lines is not None and len(lines) == 2
    assert lines[0].startswith("DAPT bought +2.3 [+0.4, +4.1] points of mean primary for 300 pretraining steps")
    assert "the baseline reached 59.0 with the same fine-tuning steps" in lines[0]
    assert lines[1] == (
        "The whole CI above 0 on 1 of 4 task(s): ner +11.0 [+6.7, +13.0]; "
        "within noise: pair +3.0 [-1.3, +7.5], qa +0.0 [-1.0, +1.0]."
    )
    same_compute = verdict(
        RESULTS,
        SUMMARY,
        PRE,
        FINE.model_copy(update={"baseline_budget": BaselineBudget(mode="same_compute", extra_steps=120)}),
    )
    assert same_compute and "given that time as 120 more fine-tuning steps, reached 59.0" in same_compute[0]
    assert all(len(line) < 260 for line in lines)  # short lines, not one ~60-word sentence


def test_watch_flags_a_class_never_predicted_the_ceiling_the_floor_and_a_clear_loss() -> None:
    flags = watch(RESULTS, EXTRAS)
    assert flags == [
        "ner: f1 100.0 (baseline 89.0) is at the ceiling: this test set cannot show a gain.",
        "pair: the adapted model never predicts contradiction (69 test examples).",
        "role: adaptation lost -4.8 [-8.0, -1.0] points, the whole CI below 0.",
        "qa: f1 5.0 is no better than the trivial baseline (majority class: 4.5).",
    ]
    healthy = {"pair": _task("macro_f1", 0.8, 0.7, 0.16, (0.01, 0.2))}
    fine = {"pair": {**EXTRAS["pair"], "confusion": {"adapted": EXTRAS["pair"]["confusion"]["baseline"]}}}
    assert watch(healthy, fine) == []


def test_an_entity_type_never_found_is_a_watch_line() -> None:
    per_type = {
        "DRUG": {"precision": 0.9, "recall": 0.8, "f1": 0.85, "support": 40},
        "DOSE": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 12},
    }
    ner = _task("f1", 0.6, 0.5, 0.0, (0.01, 0.2), per_type=per_type)
    assert watch({"ner": ner}, {}) == ["ner: the adapted model never predicts a DOSE entity (12 in the test split)."]


def test_everywhere_the_verdict_is_read_the_watch_lines_and_the_synthetic_data_follow_it() -> None:
    metrics = COMMITTED.model_copy(
        update={"verdict": ["gain", "tasks"], "watch": ["pair: never predicts x."], "synthetic": True}
    )
    assert verdict_and_watch(metrics) == ["gain", "tasks", "Watch: pair: never predicts x.", f"Watch: {SYNTHETIC}"]
    # a report of an older adaptbert (one verdict sentence) is not read as this one: evaluate makes it anew
    with pytest.raises(ReportError, match=r"verdict"):
        EvaluationReport.from_json({**COMMITTED.as_json(), "verdict": "one sentence of an older report"})


def test_the_gate_line_does_not_repeat_the_outcome() -> None:
    assert gate_reason("promoted: no champion yet and every task clears its floor") == "every task clears its floor"
    assert gate_reason("not promoted: no champion yet, and ner.f1 0.1 is below 0.2 (floor 0.2)") == (
        "ner.f1 0.1 is below 0.2 (floor 0.2)"
    )
    assert gate_reason("mean primary 0.8317 vs champion 0.8347 does not beat it.") == (
        "mean primary 0.8317 vs champion 0.8347 does not beat it"
    )


def test_a_label_with_markup_is_text_on_every_markdown_page() -> None:
    """A watch line quotes the data's label names: on a Markdown page (MLflow's note, Prefect's artifacts,
    evaluation.md, the model card) a label such as <img onerror> must stay text."""
    from pipeline.reporting.evaluation import evaluation_markdown
    from pipeline.reporting.headline import headline_markdown
    from pipeline.reporting.views import verdict_markdown

    extras = {"pair": {"labels": ["<img src=x onerror=alert(1)>", "b"], "confusion": {"adapted": [[0, 5], [0, 5]]}}}
    flags = watch({"pair": _task("macro_f1", 0.5, 0.5, 0.2, (-0.1, 0.1))}, extras)
    assert flags == ["pair: the adapted model never predicts <img src=x onerror=alert(1)> (5 test examples)."]
    metrics = COMMITTED.model_copy(update={"verdict": ["gain", "tasks"], "watch": flags, "synthetic": False})
    pages = [
        headline_markdown({"adapted": 0.5, "served": "full", "promoted": False}, verdict_and_watch(metrics)),
        verdict_markdown(metrics) or "",
    ]
    pages.append(evaluation_markdown(metrics, [], {}, None))  # evaluation.md
    assert all("&lt;img src=x onerror=alert(1)&gt;" in page and "<img" not in page for page in pages)
