"""Every corpus format reads the same documents, with 1-based line (or row) numbers."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.text.readers import ErrorPolicy, iter_records

DOCS = ['First document, with a comma and "quotes".', "Second document: ünïcödé µg 5\u00a0mg.", "Third, plain."]


def _write(fmt: str, path: Path) -> Path:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)), encoding="utf-8")
    elif fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["id", "text"])
            w.writerows(enumerate(DOCS))
    elif fmt == "tsv":
        path.write_text("id\ttext\n" + "".join(f"{i}\t{d}\n" for i, d in enumerate(DOCS)), encoding="utf-8")
    elif fmt == "txt":
        path.write_text("\n".join(DOCS) + "\n", encoding="utf-8")
    elif fmt == "paragraph":
        path.write_text("\n\n".join(d.replace(", ", ",\n") for d in DOCS) + "\n", encoding="utf-8")
    elif fmt == "parquet":
        pq.write_table(pa.table({"id": list(range(3)), "text": DOCS}), path)
    return path


TEXT_FORMATS = [
    ("jsonl", ".jsonl", "line"),
    ("csv", ".csv", "line"),
    ("tsv", ".tsv", "line"),
    ("txt", ".txt", "line"),
    ("paragraph", ".txt", "paragraph"),
]
CASES = [(*f, gz) for f in TEXT_FORMATS for gz in (False, True)] + [
    ("parquet", ".parquet", "line", False)
]  # parquet: no .gz


@pytest.mark.parametrize(("fmt", "suffix", "txt_mode", "gz"), CASES)
def test_formats_read_the_same_documents(fmt: str, suffix: str, txt_mode: str, gz: bool, tmp_path: Path) -> None:
    path = _write(fmt, tmp_path / f"docs{suffix}")
    if gz:
        gz_path = path.with_name(path.name + ".gz")
        gz_path.write_bytes(gzip.compress(path.read_bytes()))
        path = gz_path
    records = list(iter_records(path, "auto", ErrorPolicy("fail"), 1_000_000, ["text"], txt_mode))
    texts = [r["text"] for _, r in records]
    if fmt == "paragraph":
        texts = [t.replace(",\n", ", ") for t in texts]
    assert texts == DOCS
    lines = [line for line, _ in records]
    expected = {"csv": [2, 3, 4], "tsv": [2, 3, 4], "paragraph": [1, 4, 6]}.get(fmt, [1, 2, 3])
    assert lines == expected


def test_conll_sentences_and_docstart(tmp_path: Path) -> None:
    path = tmp_path / "ner.conll"
    path.write_text("-DOCSTART- -X- O O\n\nAspirin NN B-DRUG\nhelps VB O\n\n\nFever NN B-DISEASE\n", encoding="utf-8")
    records = list(iter_records(path, "auto", ErrorPolicy("fail"), 1_000_000, ["tokens", "tags"]))
    assert records == [
        (3, {"tokens": ["Aspirin", "helps"], "tags": ["B-DRUG", "O"]}),
        (7, {"tokens": ["Fever"], "tags": ["B-DISEASE"]}),
    ]


def test_lineage_hashes_regular_files_only_and_never_waits_on_a_fifo(tmp_path) -> None:
    """A FIFO under data/raw/ blocked every ingest (its tags hash the stage's deps); it is left out of the hash."""
    import os
    import subprocess
    import sys

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("one\n")
    code = "import sys; from pathlib import Path; from pipeline.tracking.lineage import dvc_md5; print(dvc_md5(Path(sys.argv[1])))"
    before = subprocess.run([sys.executable, "-c", code, str(raw)], capture_output=True, text=True, timeout=60)
    os.mkfifo(raw / "pipe")
    after = subprocess.run([sys.executable, "-c", code, str(raw)], capture_output=True, text=True, timeout=60)
    assert after.returncode == 0 and after.stdout == before.stdout and after.stdout.strip().endswith(".dir")
