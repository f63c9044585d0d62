"""Stage reports as types (issue 64, item 1): written and read through their model, byte for byte as before, and a
file the type cannot read names the stage that rewrites it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import ValidationError

from pipeline.core.errors import MissingInput
from pipeline.core.io import read_report, split_measured, write_report
from pipeline.core.paths import Paths
from pipeline.core.reports.finetune import FinetuneReport
from pipeline.core.reports.kinds import TYPED_REPORTS
from pipeline.core.reports.pretrain import PretrainReport
from tests.conftest import ROOT

COMMITTED = ROOT / "reports" / "pretrain.json"


def committed_body() -> dict:
    return {k: v for k, v in json.loads(COMMITTED.read_text()).items() if k != "_seal"}


VERSIONED = sorted(set(TYPED_REPORTS) - {"promotion_report"})  # promotion.json names this machine's registry: ignored


@pytest.mark.parametrize("attribute", VERSIONED)
def test_a_committed_report_reads_as_its_type_and_writes_back_byte_for_byte(tmp_path: Path, attribute: str) -> None:
    kind, name = TYPED_REPORTS[attribute], getattr(Paths(ROOT), attribute).name
    report = read_report(ROOT / "reports" / name, kind)
    target = tmp_path / "reports" / name
    write_report(target, report)
    # same keys, same order, same seal: dvc.lock unchanged
    assert target.read_bytes() == (ROOT / "reports" / name).read_bytes()


def test_a_finetune_report_of_every_option_keeps_the_producer_s_keys_in_order() -> None:
    """Search, the same-compute budget, side-by-side training and one model per task: each written only when it
    happened, each read back as its type (a verdict reads ``baseline_budget.extra_steps``, evaluate ``single_task``)."""
    committed = read_report(ROOT / "reports" / "finetune.json", FinetuneReport).as_json()
    model = {**committed["adapted"], "train_seconds": 30.0, "train_examples_per_s": 320.0}
    produced = {
        "adapted": model,
        "baseline": model,
        "search": {"adapted": {"finetune.learning_rate": 5e-5}},
        "baseline_budget": {
            "mode": "same_compute",
            "pretrain_seconds": 600.0,
            "adapted_steps_per_s": 3.2,
            "extra_steps": 1920,
        },
        "precision": "fp32",
        "precision_reason": "precision: auto -> fp32",
        "side_by_side": {"processes": 2, "threads_each": 1},
        "tasks": committed["tasks"],
        "single_task": {"ner": {**model, "test": {"f1": 0.8}, "primary": "f1"}},
    }
    report = FinetuneReport.model_validate(produced)
    assert report.as_json() == produced and list(report.as_json()) == list(produced)
    assert list(report.as_json()["single_task"]["ner"]) == list(produced["single_task"]["ner"])
    assert report.baseline_budget is not None and report.baseline_budget.extra_steps == 1920
    assert report.single_task is not None and report.single_task["ner"].test == {"f1": 0.8}
    stable, _ = split_measured(report.as_json())
    assert "pretrain_seconds" not in stable["baseline_budget"] and "train_seconds" not in stable["adapted"]


@pytest.mark.parametrize(
    ("task_text_blocks", "train_blocks", "named"), [(0, 900, "DAPT"), (120, 120, "TAPT"), (120, 1020, "DAPT+TAPT")]
)
def test_what_a_pretraining_run_trained_on_is_named_as_the_literature_names_it(
    task_text_blocks: int, train_blocks: int, named: str
) -> None:
    body = {**committed_body(), "task_text_blocks": task_text_blocks, "train_blocks": train_blocks}
    assert PretrainReport.model_validate(body).text_trained == named


def test_each_kind_of_run_keeps_only_its_own_keys() -> None:
    """A run that chose no adaptation writes its two keys and none of DAPT's (masking, budget, electra...)."""
    body = committed_body()
    short = {k: v for k, v in body.items() if k not in ("masking", "mask_token", "similar_word_coverage")}
    kept = PretrainReport.model_validate({"adaptation": "none", "adaptation_reason": "none won on dev", **short})
    assert list(kept.as_json())[:3] == ["adaptation", "adaptation_reason", "base_model"]
    assert "masking" not in kept.as_json() and "budget" not in kept.as_json() and not kept.adapted


def test_measured_keys_go_to_their_half_and_come_back_when_read(tmp_path: Path) -> None:
    report = read_report(COMMITTED, PretrainReport).model_copy(update={"train_seconds": 12.5, "tokens_per_s": 900})
    stable, measured = split_measured(report.as_json())
    assert "train_seconds" not in stable and measured == {"train_seconds": 12.5, "tokens_per_s": 900}
    target = tmp_path / "reports" / "pretrain.json"
    write_report(target, report)
    assert read_report(target, PretrainReport).train_seconds == 12.5
    # the measurements are never an input to trust: a key the type does not know there is left out, not an error
    (target.parent / "measured" / "pretrain.json").write_text(json.dumps({"train_seconds": 3.0, "gpu_hours": 1}))
    assert read_report(target, PretrainReport).train_seconds == 3.0


def test_a_key_the_producer_sets_and_the_type_does_not_name_fails_where_it_is_written() -> None:
    with pytest.raises(ValidationError, match="perplexity_adaptd"):
        PretrainReport.model_validate({**committed_body(), "perplexity_adaptd": 1.0})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda b: {k: v for k, v in b.items() if k != "adapted_perplexity"}, "adapted_perplexity: Field required"),
        (lambda b: {**b, "global_step": "many"}, "global_step: Input should be a valid integer"),
        (lambda b: {**b, "schema": 2}, "schema version 2, this adaptbert reads version 1"),
    ],
)
def test_a_report_of_another_version_names_the_stage_that_rewrites_it(tmp_path: Path, change, said: str) -> None:
    target = tmp_path / "reports" / "pretrain.json"
    write_report(target, change(committed_body()))  # as an older or newer adaptbert wrote it
    with pytest.raises(MissingInput) as info:
        read_report(target, PretrainReport)
    assert said in str(info.value) and "written by another version of adaptbert" in str(info.value)
    assert "run `dvc repro pretrain`" in str(info.value) and str(target) in str(info.value)
    assert read_report(target)["base_model"] == "minilm"  # untyped readers still see the file


def test_a_raised_schema_version_is_written_and_an_older_file_is_refused(tmp_path: Path) -> None:
    """Version 1 is the layout from before the key existed (no key written); a later version writes its number."""

    class PretrainReportV2(PretrainReport):
        SCHEMA: ClassVar[int] = 2

    target = tmp_path / "reports" / "pretrain.json"
    write_report(target, committed_body())
    with pytest.raises(MissingInput, match="schema version 1, this adaptbert reads version 2"):
        read_report(target, PretrainReportV2)
    newer = PretrainReportV2.model_validate(committed_body())
    assert newer.as_json()["schema"] == 2 and "schema" not in PretrainReport.model_validate(committed_body()).as_json()
    write_report(target, newer)
    assert read_report(target, PretrainReportV2) == newer
