"""A corpus spread over files with every kind of drop, and a helper that ingests it on one engine: what the engines'
byte-for-byte tests share (tests/data/test_ingest_ray.py, tests/data/test_ingest_disk.py)."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path
from typing import Any

from pipeline.core.paths import Paths
from pipeline.stages import ingest
from tests.conftest import make_config

ENGINE_ONLY = ("seconds", "near_checks_seconds", "engine_seconds", "engine", "engine_cluster", "index")  # may differ


def random_document(rng: random.Random, words: int = 80) -> str:
    """A document of random words from a small vocabulary: distinct documents share almost no 5-word shingle."""
    vocabulary = [f"w{i}" for i in range(600)]
    return " ".join(rng.choice(vocabulary) for _ in range(words)) + "."


def one_word_changed(text: str, at: int) -> str:
    """``text`` with word ``at`` replaced: Jaccard ~0.88 over 5-word shingles for 80 words (a near-duplicate)."""
    words = text.split()
    words[at] = "changed"
    return " ".join(words)


def evaluation_sentences(demo: Path) -> list[str]:
    """The longest validation sentences of the demo's role task (long enough for the leakage guard)."""
    with open(demo / "tasks" / "role" / "validation.csv", encoding="utf-8") as f:
        rows = [r["sentence"] for r in csv.DictReader(f)]
    return sorted(rows, key=len, reverse=True)[:2]


def write_mixed_corpus(folder: Path, demo: Path) -> list[dict[str, Any]]:
    """Five files: unique, duplicate (within and across files), near-duplicate (a chain too), leaked, contaminated,
    too short and bad records, an empty file; returns the sources for params."""
    rng = random.Random(7)
    docs = [random_document(rng) for _ in range(60)]
    leaked, contaminated = evaluation_sentences(demo)
    folder.mkdir()
    first = docs[:40] + [docs[3], f"Background. {leaked} More text follows here."] + ["too short"]
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in first), encoding="utf-8")
    chain_b = one_word_changed(docs[5], 10)  # near-copies docs[5] (kept): dropped
    chain_c = one_word_changed(chain_b, 40)  # near-copies chain_b (dropped) more than docs[5]: the rule decides
    second = [*docs[40:55], docs[7], chain_b, chain_c, one_word_changed(contaminated, 5)]
    (folder / "b.txt").write_text("\n".join(second) + "\n", encoding="utf-8")
    bad = [json.dumps({"text": docs[55]}), '{"text": "unterminated', json.dumps({"text": 5}), json.dumps({"body": "x"})]
    (folder / "c.jsonl").write_text("\n".join([*bad, json.dumps({"text": docs[56]})]) + "\n", encoding="utf-8")
    (folder / "d.jsonl").write_bytes(b"")
    with open(folder / "e.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        writer.writerows([[t] for t in [*docs[57:], docs[0], one_word_changed(docs[58], 3)]])
    return [{"type": "files", "path": str(folder / "*.jsonl")}, {"type": "files", "path": str(folder / "*[tv]")}]


def run_engine(built_demo, root: Path, engine: str, sources: list[dict[str, Any]], **overrides: Any) -> dict:
    _, demo_paths = built_demo
    paths = Paths(root)
    shutil.copytree(demo_paths.demo, paths.demo)
    cfg = make_config(
        **{
            "ingest.engine": engine,
            "ingest.corpus.sources": sources,
            "ingest.corpus.min_chars": 20,
            "ingest.corpus.min_words": 4,
            "ingest.on_error": "skip",
            "ingest.shard_mb": 0.007,  # 7 KB: file groups a.jsonl | c, d, b.txt | e.csv; pieces at 7 docs per row group
            **overrides,
        }
    )
    report = ingest.run(cfg, paths).as_json()
    return {k: v for k, v in report.items() if k not in ENGINE_ONLY}


def corpus_bytes(root: Path) -> dict[str, bytes]:
    """Every file of the project's corpus (its shards and manifest), by path."""
    corpus = root / "data" / "corpus"
    return {str(p.relative_to(corpus)): p.read_bytes() for p in sorted(corpus.rglob("*")) if p.is_file()}
