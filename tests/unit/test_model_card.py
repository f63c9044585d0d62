"""The model card of a registered version: Hugging Face format (huggingface_hub parses it), test metrics with their
CIs in the metadata, the sections a person reads. Built from the committed default run's reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.io import read_report
from pipeline.core.reports.compression import CompressionReport
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.reporting.headline import summary_headline
from pipeline.reporting.model_card import CardInputs, card_body, description, model_card
from pipeline.reporting.numbers import points
from pipeline.tracking.versions import variant_scores, version_description
from tests.conftest import ROOT

REPORTS = ROOT / "reports"
PROVENANCE = {
    "git.commit": "0123456789abcdef0123456789abcdef01234567",
    "git.dirty": "false",
    "data_hash": "d" * 32,
    "params_hash": "p" * 16,
    "dvc.pretrain.models/dapt": "a" * 32 + ".dir",
    "dvc.finetune.models/finetuned": "b" * 32 + ".dir",
}


def _inputs(variant: str = "full", profile: str | None = None) -> CardInputs:
    metrics = read_report(REPORTS / "metrics.json", EvaluationReport)
    compression = read_report(REPORTS / "compression.json", CompressionReport)
    parent = None if variant == "full" else "7"
    entry = compression.model(variant)
    shown = metrics.version_scores() if variant == "full" else variant_scores(metrics, compression, variant)
    return CardInputs(
        "adaptbert",
        "7" if variant == "full" else "8",
        variant,
        parent,
        version_description(variant, shown, entry, parent),
        shown,
        metrics,
        entry,
        PROVENANCE,
        read_report(REPORTS / "pretrain.json", PretrainReport),
        "minilm",
        profile,
        "runs:/abc/lineage.json",
        13,
        "apache-2.0",
        ("en",),
    )


def test_the_card_parses_with_huggingface_hub_and_holds_the_test_metrics_with_their_cis(tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    inputs = _inputs()
    path = tmp_path / "README.md"
    path.write_text(model_card(inputs), encoding="utf-8")
    card = ModelCard.load(path)  # as from the Hub: front matter validated, model-index parsed
    data = card.data
    assert data.base_model == "sentence-transformers/all-MiniLM-L6-v2" and data.library_name == "transformers"
    assert data.model_name == "adaptbert v7" and data.datasets is None  # Hub dataset ids: the tasks are files
    assert (data.license, data.language) == ("apache-2.0", ["en"])
    results = {r.task_name: r for r in data.eval_results}
    assert set(results) == set(inputs.metrics.tasks)
    for task, t in inputs.metrics.as_json()["tasks"].items():
        r = results[task]
        assert (r.metric_type, r.dataset_split) == (t["primary"], "test")
        assert r.metric_value == pytest.approx(t["adapted"][t["primary"]], abs=1e-4)
        gain = data.adaptbert["gains"][task]  # the CI as numbers
        assert (gain["delta"], gain["ci_low"], gain["ci_high"]) == pytest.approx(
            (t["delta"], t["ci_low"], t["ci_high"]), abs=1e-4
        )
        assert gain["against"] == "un-adapted baseline" and f"{points(t['ci_low'], signed=True)}" in r.metric_name
        # the metric's own interval (not only its gain's): around the value, in the name a Hub page shows
        low, high = t["primary_ci"]["adapted"]
        assert low <= t["adapted"][t["primary"]] <= high  # [1.0, 1.0] where every test answer was right (ner)
        assert data.adaptbert["test_ci"][task] == pytest.approx({"low": low, "high": high, "confidence": 0.95})
        assert f"95% CI [{points(low)}, {points(high)}]" in r.metric_name
    assert results["ner"].task_type == "token-classification" and results["qa"].task_type == "question-answering"
    assert data.adaptbert["lineage"]["dvc.pretrain.models/dapt"] == PROVENANCE["dvc.pretrain.models/dapt"]
    body = card.text
    for heading in ("Intended use", "Limitations", "Evaluation", "Budget and hardware", "Lineage", "Reproduce"):
        assert f"\n## {heading}" in body, heading
    assert "## Variant" not in body and all(line in body for line in inputs.metrics.verdict or [])
    assert f"git checkout {PROVENANCE['git.commit']}" in body and "dvc repro" in body
    assert inputs.pretrain.precision_reason in body  # the hardware pretraining ran on
    # the run's headline as the run report, the MLflow note, the console and adaptbert history say it
    assert f"Mean primary test metric (points): {summary_headline(inputs.metrics.summary)}." in body
    assert "One run (seed 13) scored once on the test splits" in body and "(1000 resamples, " in body
    ner = inputs.metrics.as_json()["tasks"]["ner"]
    shown = f"| {points(ner['adapted']['f1'])} [{points(ner['primary_ci']['adapted'][0])}, "
    assert shown in body  # the evaluation table: this version's value with its CI


def test_a_variant_card_compares_with_its_full_model_and_says_what_it_costs() -> None:
    from huggingface_hub import ModelCard

    compression = read_report(REPORTS / "compression.json", CompressionReport)
    variant = next(iter(compression.variants))
    inputs = _inputs(variant, profile="smoke")
    card = ModelCard(model_card(inputs))
    assert variant in card.data.tags and "smoke" in card.data.tags
    assert card.data.adaptbert["parent_version"] == "7"
    gains = card.data.adaptbert["gains"]
    assert gains and all(g["against"] == "full model v7" for g in gains.values())
    for task, entry in compression.variants[variant].tasks.items():  # the variant's own test CIs
        low, high = entry.value_ci
        assert low <= entry.value <= high
        assert card.data.adaptbert["test_ci"][task] == pytest.approx({"low": low, "high": high, "confidence": 0.95})
    assert "## Variant" in card.text and f"{variant} of version 7" in card.text
    assert "| full model v7 |" in card.text  # the evaluation table's comparison column
    assert "A run of profile `smoke`" in card.text and "python -m flows.profile smoke --run" in card.text


def test_the_description_keeps_whole_sections_within_mlflows_limit() -> None:
    body = card_body(_inputs())
    assert description(body, "7") == body  # it fits
    short = description(body, "7", limit=600)
    more = "\n\n(the whole card: `adaptbert models card 7`)"
    assert len(short) <= 600 and short.endswith(more)
    kept = short.removesuffix(more)
    assert kept.startswith(body.split("\n\n## ")[0])  # the title and the one-line summary first ...
    assert body.startswith(kept) and body[len(kept) :].startswith("\n\n## ")  # ... then whole sections only


def test_the_registry_description_starts_with_the_one_line_summary() -> None:
    """Was: the card's '# adaptbert v7 (full model)' heading, which is all the registry's Description column shows."""
    from pipeline.reporting.model_card import registry_description

    inputs = _inputs()
    said = registry_description(inputs)
    assert said.startswith(inputs.summary_line + "\n\n## ") and not said.startswith("#")
    assert "## Evaluation (test splits, in points)" in said
