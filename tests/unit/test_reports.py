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
from pipeline.core.reports.pretrain import PretrainReport
from tests.conftest import ROOT

COMMITTED = ROOT / "reports" / "pretrain.json"


def committed_body() -> dict:
    return {k: v for k, v in json.loads(COMMITTED.read_text()).items() if k != "_seal"}


def test_a_committed_report_reads_as_its_type_and_writes_back_byte_for_byte(tmp_path: Path) -> None:
    report = read_report(COMMITTED, PretrainReport)
    assert report.adapted and report.adapted_perplexity == committed_body()["adapted_perplexity"]
    target = tmp_path / "reports" / "pretrain.json"
    write_report(target, report)
    assert target.read_bytes() == COMMITTED.read_bytes()  # same keys, same order, same seal: dvc.lock unchanged


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
