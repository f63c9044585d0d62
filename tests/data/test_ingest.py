"""ingest: normalisation, dedup, length filters, leakage guard, splits and task outputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.core.paths import Paths
from pipeline.stages import ingest
from pipeline.tasks.reading import normalize_task_record
from pipeline.text.corpus import LeakageGuard
from tests.conftest import corpus_rows, corpus_texts, make_config


def _write_corpus(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")


def _project_with_corpus(built_demo, tmp_path: Path, texts: list[str], **overrides):
    _, demo_paths = built_demo
    paths = Paths(tmp_path / "proj")
    shutil.copytree(demo_paths.demo, paths.demo)
    _write_corpus(tmp_path / "corpus.jsonl", texts)
    cfg = make_config(
        **{
            "ingest.corpus.sources": [{"type": "files", "path": str(tmp_path / "corpus.jsonl")}],
            "ingest.corpus.min_chars": 20,
            "ingest.corpus.min_words": 4,
            **overrides,
        }
    )
    return cfg, paths


def test_dedup_filters_and_report(built_demo, tmp_path: Path) -> None:
    docs = [f"Report {i}: the kestxevir arm had {i} responders in total." for i in range(50)]
    texts = docs + [
        docs[0],
        "  " + docs[1].replace(" ", "\u00a0 ") + "\u200b",  # exact dups after normalisation
        "too short",
        "tiny doc",  # under min_chars
        "x" * 30,  # enough chars, one word
        "   \t ",  # empty after normalisation
    ]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, texts, **{"ingest.corpus.max_chars": 200})
    report = ingest.run(cfg, paths).as_json()["corpus"]
    assert report["documents_read"] == len(texts)
    assert report["dropped"] == {"duplicate": 2, "empty": 1, "too_short_chars": 2, "too_short_words": 1}
    assert report["documents_kept"] == 50
    assert report["duplicate_ratio"] == round(2 / len(texts), 6)
    kept = corpus_texts(paths)
    assert sorted(kept) == sorted(docs)
    assert report["characters"] == sum(len(t) for t in docs)
    assert report["words"] == sum(len(t.split()) for t in docs)


def test_parquet_rows_carry_source_and_line(built_demo, tmp_path: Path) -> None:
    docs = [f"Line {i} of the corpus mentions trovvavir and Harlow-Venner syndrome." for i in range(30)]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, docs)
    ingest.run(cfg, paths)
    rows = corpus_rows(paths)
    by_text = {r["text"]: r for r in rows}
    for i, d in enumerate(docs):
        assert by_text[d]["line"] == i + 1
        assert by_text[d]["source"].endswith("corpus.jsonl")
        assert by_text[d]["words"] == len(d.split())


def test_adding_documents_never_moves_old_ones(built_demo, tmp_path: Path) -> None:
    old = [f"Document {i} discusses the pramtiolol trial outcome." for i in range(300)]
    cfg, paths = _project_with_corpus(built_demo, tmp_path / "a", old, **{"ingest.corpus.validation_fraction": 0.2})
    ingest.run(cfg, paths)
    first = {s: set(corpus_texts(paths, s)) for s in ("train", "validation")}
    new = [f"Another document {i} on galtimab dosing." for i in range(300)]
    cfg2, paths2 = _project_with_corpus(
        built_demo, tmp_path / "b", new + old, **{"ingest.corpus.validation_fraction": 0.2}
    )
    ingest.run(cfg2, paths2)
    second = {s: set(corpus_texts(paths2, s)) for s in ("train", "validation")}
    assert first["train"] <= second["train"]
    assert first["validation"] <= second["validation"]
    assert 0 < len(first["validation"]) < len(first["train"])


def test_leakage_guard_drops_documents_containing_eval_text(built_demo, tmp_path: Path) -> None:
    _cfg0, demo_paths = built_demo
    test_sentence = pq.read_table(demo_paths.tasks / "role" / "test.parquet")["text"][0].as_py()
    train_sentence = pq.read_table(demo_paths.tasks / "role" / "train.parquet")["text"][0].as_py()
    docs = [
        f"Introduction of a report. {test_sentence.upper()} And more text follows here.",  # case differs
        f"Another report. {test_sentence.replace(' ', '  ')} Then it ends.",  # spacing differs
        f"A third report quoting a train sentence: {train_sentence} That is allowed.",
        "An unrelated report about the lumtiolol study with enough words.",
    ]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, docs)
    report = ingest.run(cfg, paths).as_json()
    assert report["leakage"]["documents_dropped"] == 2
    assert report["leakage"]["evaluation_texts_indexed"] > 0
    kept = corpus_texts(paths)
    assert len(kept) == 2 and all(test_sentence not in k for k in kept)


def test_leakage_guard_ignores_short_generic_texts() -> None:
    guard = LeakageGuard(["Not applicable.", "The primary outcome was met in most of the patients."], min_chars=30)
    assert guard.size == 1
    assert not guard.leaks("Conflicts: not applicable. Nothing else.")
    assert guard.leaks("Results: the primary outcome was met in most of the patients. End.")


def test_task_outputs_and_label_maps(built_demo) -> None:
    cfg, paths = built_demo
    for task in cfg.ingest.tasks:
        meta = json.loads((paths.tasks / task.name / "task.json").read_text())
        assert meta["type"] == task.type
        for split in ("train", "validation", "test"):
            table = pq.read_table(paths.tasks / task.name / f"{split}.parquet")
            assert table.num_rows == meta["examples"][split] > 0
            assert {"id", "source_file", "source_line"} <= set(table.column_names)
    role = json.loads((paths.tasks / "role" / "task.json").read_text())
    assert role["labels"] == sorted(["BACKGROUND", "OBJECTIVE", "METHODS", "RESULTS", "CONCLUSIONS"])
    assert role["labels_from"] == "train"
    pair = json.loads((paths.tasks / "pair" / "task.json").read_text())
    assert pair["labels"] == ["entailment", "neutral", "contradiction"] and pair["labels_from"] == "params"
    ner = json.loads((paths.tasks / "ner" / "task.json").read_text())
    assert ner["labels"][0] == "O" and "B-DRUG" in ner["labels"]


def test_qa_offsets_follow_normalisation(built_demo) -> None:
    cfg, _ = built_demo
    qa = next(t for t in cfg.ingest.tasks if t.type == "extractive_qa")
    context = "Patients\u00a0received  zorvatinib 5\u00a0µg\u200b daily."
    start = context.index("5\u00a0µg")
    rec = {"question": "What dose?", "context": context, "answers": {"text": ["5\u00a0µg"], "answer_start": [start]}}
    row = normalize_task_record(qa, rec, Path("x.jsonl"), 1, "NFKC")
    s = row["answer_starts"][0]
    assert row["context"] == "Patients received zorvatinib 5 μg daily."
    assert row["context"][s : s + len(row["answer_texts"][0])] == row["answer_texts"][0] == "5 μg"
