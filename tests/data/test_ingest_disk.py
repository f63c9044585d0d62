"""``ingest.index: disk``: the local engine with its dedup indexes sorted on disk writes the in-memory index's files,
byte for byte, and the same report, for a corpus with every kind of drop; bad input is named the same way; nothing
is left on disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import DataError
from pipeline.text import corpus_disk
from pipeline.text.corpus_disk import INDEX_DIR, PairFile
from tests.data.mixed_corpus import corpus_bytes, run_engine, write_mixed_corpus


@pytest.mark.parametrize(
    "setting",
    [
        {"ingest.chunk_docs": 5000},  # one row group, one batch, one partition
        {"ingest.chunk_docs": 7},  # many row groups and batches
        {"ingest.near_duplicates.enabled": False},  # exact dedup and contamination only: no sketches
        {"ingest.near_duplicates.enabled": False, "ingest.decontamination.enabled": False},  # no near checks at all
    ],
    ids=["one-batch", "many-batches", "no-near-duplicates", "no-near-checks"],
)
def test_the_disk_index_writes_the_memory_index_s_files_byte_for_byte(
    built_demo, tmp_path: Path, setting: dict
) -> None:
    sources = write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    memory = run_engine(built_demo, tmp_path / "memory", "local", sources, **setting)
    disk = run_engine(built_demo, tmp_path / "disk", "local", sources, **setting, **{"ingest.index": "disk"})
    assert disk == memory
    assert corpus_bytes(tmp_path / "disk") == corpus_bytes(tmp_path / "memory")
    c = memory["corpus"]  # every kind of drop happened, so the equality covers each
    assert c["dropped"]["duplicate"] == 3 and c["dropped"]["leakage"] == 1 and c["dropped"]["bad_record"] == 1
    near = not setting.get("ingest.near_duplicates.enabled", True)
    assert c["dropped"].get("near_duplicate", 0) == (0 if near else 2)
    assert not (tmp_path / "disk" / INDEX_DIR).exists()  # the index's files are removed after the run


def test_many_partitions_and_resolution_chunks_decide_as_one(
    built_demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pairs cut into many partitions and read back a few at a time, signatures resolved a few at a time: the
    decisions do not depend on where the cuts fall."""
    sources = write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    memory = run_engine(built_demo, tmp_path / "memory", "local", sources)
    monkeypatch.setattr(corpus_disk, "PARTITION_BYTES", 16 * 50)  # ~50 pairs a partition: 16-32 partitions
    monkeypatch.setattr(corpus_disk, "COPY_PAIRS", 64)
    monkeypatch.setattr(corpus_disk, "RESOLVE_DOCS", 3)
    disk = run_engine(built_demo, tmp_path / "disk", "local", sources, **{"ingest.index": "disk"})
    assert disk == memory
    assert corpus_bytes(tmp_path / "disk") == corpus_bytes(tmp_path / "memory")


def test_partitions_hold_every_pair_once_and_each_key_in_one_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus_disk, "PARTITION_BYTES", 16 * 1000)
    monkeypatch.setattr(corpus_disk, "COPY_PAIRS", 777)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**64 - 1, size=3000, dtype=np.uint64)[rng.integers(0, 3000, size=10_000)]  # repeats
    ordinals = np.arange(10_000, dtype=np.int64)
    pairs = PairFile(tmp_path, "t")
    for start in range(0, 10_000, 999):
        pairs.add(keys[start : start + 999], ordinals[start : start + 999])
    parts = list(pairs.partitions())
    assert len(parts) == 16  # 10,000 pairs x 16 bytes / 16,000 -> 2**4 partitions
    assert sorted(np.concatenate([o for _, o in parts]).tolist()) == ordinals.tolist()
    owners = [set(k.tolist()) for k, _ in parts]
    assert sum(len(o) for o in owners) == len(set(keys.tolist()))  # no key in two partitions
    assert all(k.tolist() == keys[o].tolist() for k, o in parts)  # each ordinal still with its own key
    assert list(tmp_path.iterdir()) == []  # the flat files and partitions are removed as they are read


def test_a_bad_record_stops_the_disk_index_naming_file_line_and_rule(built_demo, tmp_path: Path) -> None:
    sources = write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    root = tmp_path / "proj"
    run_engine(built_demo, root, "local", [sources[1]], **{"ingest.index": "disk"})  # good outputs first
    before = corpus_bytes(root)
    shutil.rmtree(root / "data" / "demo")
    with pytest.raises(DataError, match=r"c\.jsonl:2: \[malformed-json\]") as info:
        run_engine(built_demo, root, "local", sources, **{"ingest.on_error": "fail", "ingest.index": "disk"})
    assert (info.value.rule, info.value.line) == ("malformed-json", 2)
    assert corpus_bytes(root) == before  # the previous outputs stay
    assert not (root / INDEX_DIR).exists()


def test_hashes_keep_all_64_bits_beside_rows_without_a_document() -> None:
    """Two texts whose hashes differ only in the low bits, beside a row without a hash: distinct (read as float64,
    as ``to_numpy`` reads a column with nulls, they were one and the later text a "duplicate")."""
    import pyarrow as pa

    from pipeline.text.corpus_rows import hash_column, later_copies

    table = pa.table({"hash": pa.array([2**63 + 1, None, 2**63 + 2], pa.uint64())})
    hashes = hash_column(table)
    assert hashes.dtype == np.uint64 and hashes.tolist() == [2**63 + 1, 0, 2**63 + 2]
    assert later_copies(hashes[[0, 2]], np.array([0, 2])).tolist() == []


def test_a_corpus_with_no_document_left_is_named_as_such(built_demo, tmp_path: Path) -> None:
    """Nothing passes the filters: no pairs to group, no signatures to read; the stage's own error, no traceback."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "too short"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="no-documents"):
        run_engine(built_demo, tmp_path / "p", "local", [{"type": "files", "path": str(folder / "*.jsonl")}],
                   **{"ingest.index": "disk"})  # fmt: skip
