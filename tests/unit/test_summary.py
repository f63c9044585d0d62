"""What a re-run may change and what it may not: reports split from their measurements; the headline metrics."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.io import measured_path, merge_measured, read_report, split_measured, write_report
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.reports.promotion import Serving
from pipeline.core.stages import stage_record
from pipeline.reporting.headline import headline, headline_markdown
from pipeline.tracking.runs import report_numbers
from tests.conftest import ROOT
from tests.unit import typed_reports as c

keys = st.sampled_from(["seconds", "tokens_per_s", "p50_ms", "peak_rss_mb", "steps", "loss", "tasks", "ner", "run_id"])
trees = st.recursive(
    st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
    lambda inner: st.dictionaries(keys, inner, max_size=4),
)


@settings(deadline=None)  # the first example pays for imports
@given(st.dictionaries(keys, trees, max_size=6))
def test_splitting_off_the_measurements_loses_nothing(report: dict) -> None:
    stable, measured = split_measured(report)
    assert merge_measured(stable, measured) == report
    assert not any(k in ("seconds", "tokens_per_s", "p50_ms", "peak_rss_mb", "run_id") for k in stable)


def test_a_report_on_disk_keeps_timings_out_of_the_versioned_file(tmp_path: Path) -> None:
    report = {"steps": 300, "train_seconds": 163.0, "tokens_per_s": 3766, "speed": {"bf16": {"p50_ms": 11.2}}}
    path = tmp_path / "reports" / "pretrain.json"
    write_report(path, report)
    on_disk = json.loads(path.read_text())  # what git and dvc.lock see: the same on a re-run
    assert on_disk == {"steps": 300, "_seal": on_disk["_seal"]} and len(on_disk["_seal"]) == 64
    assert measured_path(path) == tmp_path / "reports" / "measured" / "pretrain.json"
    assert read_report(path) == report  # readers get the whole report back
    measured_path(path).unlink()
    assert read_report(path) == {"steps": 300}  # measurements are never an input to trust


COMMITTED = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
SUMMARY = {"mean_primary_adapted": 0.83909, "mean_primary_baseline": 0.7904, "mean_primary_delta": 0.04869}
TASKS = {
    "role": ("macro_f1", {"macro_f1": 0.85228, "accuracy": 0.85}),
    "ner": ("f1", {"f1": 1.0, "precision": 1.0}),
}
METRICS = COMMITTED.model_copy(
    update={
        "summary": COMMITTED.summary.model_copy(update={**SUMMARY, "perplexity_adapted": 1.627}),
        "tasks": {
            name: COMMITTED.tasks["role" if name == "role" else "ner"].model_copy(
                update={"primary": primary, "adapted": adapted}
            )
            for name, (primary, adapted) in TASKS.items()
        },
    }
)


def test_the_headline_holds_the_means_the_gain_perplexity_each_tasks_primary_and_the_decision() -> None:
    promotion = c.promotion(serving=Serving(choice="int8", reason="-", rule={}, candidates=[]))
    summary = headline(METRICS, promotion)
    assert summary == {
        "adapted": 0.8391,
        "baseline": 0.7904,
        "gain": 0.0487,
        "ppl": 1.627,
        "ner": 1.0,
        "role": 0.8523,
        "served": "int8",
        "promoted": True,
    }
    note = headline_markdown(summary)
    assert "adapted 83.9, baseline 79.0, gain +4.9\n" in note and "| role | 85.2 |" in note
    assert "Served: **int8**; promoted to champion." in note


def test_mlflow_gets_a_stages_headline_numbers_as_metrics_and_its_set_up_as_params() -> None:
    pretrain = json.loads((ROOT / "reports" / "pretrain.json").read_text())
    metrics = report_numbers(pretrain, stage_record("pretrain").metrics)
    setup = report_numbers(pretrain, stage_record("pretrain").setup)
    assert {"adapted_perplexity", "base_perplexity", "tokens_seen"} <= set(metrics)
    assert {"block_length", "global_batch"} <= set(setup) and not set(setup) & set(metrics)
    evaluation = json.loads((ROOT / "reports" / "metrics.json").read_text())
    chosen = report_numbers(evaluation, stage_record("evaluate").metrics)
    assert "summary.mean_primary_adapted" in chosen and "tasks.ner.delta" in chosen
    assert len(chosen) < 30  # not every per-entity number: those stay in the metrics.json artifact


def test_the_verdict_says_what_was_bought_how_sure_against_the_champion_and_no_false_perplexity_gain() -> None:
    """Was: "+4.4 points bought" without a CI or the champion, and "perplexity 50,680 -> 1.63" against a freshly
    initialised MLM head (MiniLM ships none), which read as a 30,000x gain."""
    from pipeline.reporting.headline import verdict
    from pipeline.reporting.views import promotion_markdown, verdict_markdown

    metrics = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
    pretrain = read_report(ROOT / "reports" / "pretrain.json", PretrainReport)
    promotion = c.promotion(
        champion_before="2",
        champion_after="2",
        promoted=False,
        mean_primary_challenger=0.8317,
        mean_primary_champion=0.8347,
        reason="mean primary 0.8317 vs champion 0.8347 (delta -0.0030) does not beat it by min_delta 0.005",
    )
    lines = verdict(metrics, promotion, pretrain)
    significant = metrics.summary.tasks_improved_significantly  # the committed run's, whatever it is
    said = metrics.verdict or []  # the committed run's lines: the gain with its CI, then which tasks are clear
    assert lines[: len(said)] == said and f"The whole CI above 0 on {significant} of 4 task(s)" in said[1]
    rest = [line for line in lines[len(said) :] if not line.startswith("Watch: ")]  # the run's red flags, if any
    assert rest[0].startswith("Against the champion v2: -0.3 points of mean primary (83.2 vs 83.5); v3 not promoted:")
    # the committed run's perplexities, whatever they are
    base, adapted = pretrain.base_perplexity, pretrain.adapted_perplexity
    assert "ships no MLM head" in rest[1] and f"{base:,.0f} is that of a freshly initialised head" in rest[1]
    assert "->" not in rest[1]  # no comparison with the untrained head
    reason = "promoted: no champion yet and every task clears its floor"  # the gate's own words
    first = promotion.model_copy(update={"champion_before": None, "promoted": True, "reason": reason})
    assert verdict(None, first, None) == ["No champion before: v3 promoted to champion (every task clears its floor)."]
    own_head = verdict(None, None, pretrain.model_copy(update={"base_model": "models/my-bert"}))
    assert own_head == [f"Held-out masked-LM perplexity: base model {base:,.3g} -> adapted {adapted:.3g}."]
    scores = {"accuracy": 0.9, "auc": 0.9, "replaced_share": 0.15}
    electra = PretrainReport.model_validate(
        {
            **pretrain.as_json(),
            "base_model": "models/my-bert",
            "objective": "electra",
            "electra": {"generator_layers": 2, "base": scores, "adapted": scores},
        }
    )
    assert verdict(None, None, electra) == [  # the encoder predicts no tokens: the perplexity is its generator's
        f"Held-out perplexity of the 2-layer ELECTRA generator: base model {base:,.3g} -> adapted {adapted:.3g}."
    ]
    # where a person reads it: the parent run's note, the Prefect artifacts
    note = headline_markdown(headline(metrics, promotion), lines)
    assert note.startswith(said[0]) and said[1] in note and "Against the champion v2" in note
    assert verdict_markdown(metrics).startswith("# Verdict\n\n" + said[0])
    shown = promotion_markdown(promotion)
    assert "Against the champion v2: -0.3 points" in shown and "# adaptbert v3: **not promoted**" in shown


def test_the_report_states_electras_detection_scores_and_whose_perplexity_it_shows(tmp_path) -> None:
    from pipeline.reporting.html import pretrain_section

    committed = read_report(ROOT / "reports" / "pretrain.json", PretrainReport).as_json()
    pre = {
        **committed,
        "global_step": 222,
        "global_batch": 16,
        "block_length": 128,
        "base_model": "minilm",
        "precision": "fp32",
        "masking": "whole_word",
        "base_perplexity": 44714.0,
        "adapted_perplexity": 5.312,
        "objective": "electra",
        "electra": {
            "generator_layers": 2,
            "base": {"accuracy": 0.5852, "auc": 0.5412, "replaced_share": 0.15},
            "adapted": {"accuracy": 0.9781, "auc": 0.9894, "replaced_share": 0.15},
        },
    }
    page = pretrain_section(PretrainReport.model_validate(pre), tmp_path)  # no curves there: no plot
    assert "held-out perplexity of the 2-layer ELECTRA generator of the adapted model <b>5.312</b>" in page
    assert "replaced-token detection accuracy 0.585 &rarr; <b>0.978</b>, ROC AUC 0.5412 &rarr; <b>0.9894</b>" in page
    mlm_report = {k: v for k, v in pre.items() if k not in ("objective", "electra")}
    mlm = pretrain_section(PretrainReport.model_validate(mlm_report), tmp_path)
    assert "detection" not in mlm and "held-out perplexity of the adapted model" in mlm
