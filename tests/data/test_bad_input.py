"""Every kind of bad input: a clear error naming file, line and rule, or a counted skip."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from pipeline.core.errors import DataError
from pipeline.core.paths import Paths
from pipeline.stages import ingest
from pipeline.text.readers import ErrorPolicy, iter_records, resolve_paths
from tests.conftest import make_config

GOOD = [{"text": f"good document number {i} about the zorvatinib trial in cryptal myelitis patients"} for i in range(5)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _make_bad(kind: str, d: Path) -> tuple[Path, int | None, str]:
    """A file with one defect; returns its path, the line the error must name, and the rule."""
    if kind == "empty":
        p = d / "empty.jsonl"
        p.write_bytes(b"")
        return p, None, "empty-file"
    if kind == "non_utf8":
        p = d / "latin1.jsonl"
        p.write_bytes(b'{"text": "fine first line with enough words to pass"}\n{"text": "caf\xe9 au lait"}\n')
        return p, 2, "invalid-utf8"
    if kind == "malformed_json":
        p = d / "broken.jsonl"
        p.write_text('{"text": "ok line"}\n{"text": "unterminated\n{"text": "ok again"}\n', encoding="utf-8")
        return p, 2, "malformed-json"
    if kind == "csv_missing_column":
        p = d / "docs.csv"
        p.write_text("body,id\nsome text,1\n", encoding="utf-8")
        return p, 1, "missing-column"
    if kind == "truncated_gz":
        p = d / "docs.jsonl.gz"
        data = gzip.compress("".join(json.dumps(r) + "\n" for r in GOOD * 200).encode())
        p.write_bytes(data[: len(data) // 2])
        return p, None, "corrupt-gzip"
    if kind == "binary":
        p = d / "model.jsonl"
        p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
        return p, None, "binary-file"
    if kind == "huge_line":
        p = d / "huge.jsonl"
        with open(p, "wb") as f:
            f.write(b'{"text": "' + b"a" * (50 * 1024 * 1024) + b'"}\n')
            f.write(b'{"text": "a normal line after the huge one, long enough"}\n')
        return p, 1, "record-too-large"
    if kind == "not_an_object":
        p = d / "list.jsonl"
        p.write_text('["a", "b"]\n', encoding="utf-8")
        return p, 1, "not-an-object"
    raise AssertionError(kind)


KINDS = [
    "empty",
    "non_utf8",
    "malformed_json",
    "csv_missing_column",
    "truncated_gz",
    "binary",
    "huge_line",
    "not_an_object",
]


@pytest.mark.parametrize("kind", KINDS)
def test_fail_policy_names_file_line_and_rule(kind: str, tmp_path: Path) -> None:
    path, line, rule = _make_bad(kind, tmp_path)
    with pytest.raises(DataError) as info:
        list(iter_records(path, "auto", ErrorPolicy("fail"), 10_000_000, ["text"]))
    err = info.value
    assert (err.path, err.rule) == (str(path), rule)
    if line is not None:
        assert err.line == line
        assert f"{path}:{line}: [{rule}]" in str(err)
    else:
        assert str(err).startswith(f"{path}")


@pytest.mark.parametrize("kind", KINDS)
def test_skip_policy_counts_and_keeps_the_good_records(kind: str, tmp_path: Path) -> None:
    path, _, rule = _make_bad(kind, tmp_path)
    policy = ErrorPolicy("skip")
    records = list(iter_records(path, "auto", policy, 10_000_000, ["text"]))
    assert policy.counts[rule] == 1
    assert policy.examples[0]["rule"] == rule
    if kind in ("non_utf8", "malformed_json", "huge_line"):
        assert len(records) >= 1  # the good lines around the bad one are kept


def test_missing_path_always_fails(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\[missing-path\]"):
        resolve_paths(str(tmp_path / "nope" / "*.jsonl"))


def test_huge_line_is_never_held_whole(tmp_path: Path) -> None:
    path, _, _ = _make_bad("huge_line", tmp_path)
    tracemalloc.start()
    list(iter_records(path, "jsonl", ErrorPolicy("skip"), 1_000_000, ["text"]))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # the line is 50 MiB; reading stays within a few MiB


def _corpus_config(paths: list[Path], on_error: str):
    sources = [{"type": "files", "path": str(p)} for p in paths]
    return make_config(
        **{
            "ingest.corpus.sources": sources,
            "ingest.on_error": on_error,
            "ingest.corpus.min_words": 3,
            "ingest.corpus.min_chars": 10,
        }
    )


def test_ingest_fail_stops_and_keeps_previous_outputs(project, tmp_path: Path) -> None:
    _cfg, paths = project
    before = {p: p.read_bytes() for p in paths.corpus.rglob("*") if p.is_file()}
    bad, line, rule = _make_bad("malformed_json", tmp_path)
    cfg_bad = _corpus_config([bad], "fail")
    with pytest.raises(DataError, match=rf"broken.jsonl:{line}: \[{rule}\]"):
        ingest.run(cfg_bad, paths)
    assert {p: p.read_bytes() for p in paths.corpus.rglob("*") if p.is_file()} == before
    assert not list(paths.root.glob("data/.*tmp-*"))  # no temporary leftovers


def test_ingest_skip_counts_every_rule(tmp_path: Path, built_demo) -> None:
    _cfg0, demo_paths = built_demo
    paths = Paths(tmp_path / "proj")
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    files = [_jsonl(bad_dir / "good.jsonl", GOOD)]
    rules = []
    for kind in ["empty", "non_utf8", "malformed_json", "binary", "not_an_object"]:
        sub = bad_dir / kind
        sub.mkdir()
        path, _, rule = _make_bad(kind, sub)
        files.append(path)
        rules.append(rule)
    import shutil

    shutil.copytree(demo_paths.demo, paths.demo)
    report = ingest.run(_corpus_config(files, "skip"), paths).as_json()
    corpus = report["corpus"]
    assert corpus["errors_skipped"] == {r: 1 for r in sorted(rules)}
    assert corpus["train_documents"] + corpus["validation_documents"] >= len(GOOD)


def test_hf_source_offline_is_a_clear_error_not_a_hang(project, monkeypatch) -> None:
    import time

    _cfg, paths = project
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg_hf = make_config(**{"ingest.corpus.sources": [{"type": "hf", "name": "someone/not-a-real-corpus"}]})
    start = time.monotonic()
    with pytest.raises(DataError, match=r"hf:someone/not-a-real-corpus\[train\]: \[hf-unavailable\].*HF_HUB_OFFLINE"):
        ingest.run(cfg_hf, paths)
    assert time.monotonic() - start < 60
