"""Real public data from ../shared/data, read in place through params (skips when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import ingest, validate
from pipeline.paths import Paths

from .conftest import SHARED_DATA, make_config

BIO = SHARED_DATA / "biomed"


@pytest.mark.skipif(not BIO.exists(), reason="../shared/data/biomed not present")
def test_biomedical_corpus_and_tasks_ingest_and_validate(tmp_path: Path) -> None:
    def splits(task: str) -> dict[str, str]:
        return {"train": str(BIO / task / "train.jsonl"), "validation": str(BIO / task / "dev.jsonl"), "test": str(BIO / task / "test.jsonl")}

    cfg = make_config(**{
        "ingest.corpus.sources": [{"type": "files", "path": str(BIO / "corpus" / "*.jsonl")}],
        "ingest.tasks": [
            {"name": "rct", "type": "sequence_classification", "files": splits("rct")},
            {"name": "ncbi_disease", "type": "token_classification", "files": splits("ncbi_disease")},
        ],
    })
    paths = Paths(tmp_path)
    report = ingest.run(cfg, paths)
    assert report["corpus"]["documents_read"] == 3807 + 64  # the two corpus files, per their README
    assert report["corpus"]["documents_kept"] > 3500
    assert report["tasks"]["rct"]["splits"]["train"]["examples"] == 20000
    assert report["tasks"]["ncbi_disease"]["splits"]["test"]["examples"] == 940
    result = validate.run(cfg, paths)
    assert result["failed_expectations"] == 0
