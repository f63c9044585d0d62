"""The sharded corpus (``data/corpus/<split>/part-<group>-<piece>.parquet`` + manifest): where the cuts fall, what the
manifest says, and what readers do with a damaged layout."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import MissingInput
from pipeline.core.io import file_digest
from pipeline.core.paths import Paths
from pipeline.stages import ingest, tokenize, validate
from pipeline.text.corpus_shards import MANIFEST, corpus_files, file_groups, iter_corpus_batches, read_corpus_manifest
from tests.conftest import make_config
from tests.data.mixed_corpus import run_engine, write_mixed_corpus

SHARD_BYTES = 7_000  # run_engine's ingest.shard_mb: 0.007


@given(st.lists(st.one_of(st.none(), st.integers(0, 50)), max_size=30), st.integers(1, 60))
def test_file_groups_are_consecutive_runs_closed_once_they_hold_enough(sizes: list[int | None], limit: int) -> None:
    groups = file_groups(sizes, limit)
    assert len(groups) == len(sizes)
    assert groups == sorted(groups) and (not groups or groups[0] == 0)
    assert all(b - a in (0, 1) for a, b in itertools.pairwise(groups))  # no group number skipped
    for group in set(groups):
        members = [s for s, g in zip(sizes, groups, strict=True) if g == group]
        if None in members:
            assert members == [None]  # a file of unknown size (a hub dataset) is a group of its own
            continue
        assert sum(members[:-1]) < limit  # a group closes at the first file that brings it to the limit
        following = groups.index(group + 1) if group + 1 in groups else None
        if following is not None and sizes[following] is not None:
            assert sum(members) >= limit  # and earlier only where a file of unknown size follows


def test_shards_follow_file_groups_and_pieces_and_the_manifest_lists_each(built_demo, tmp_path: Path) -> None:
    sources = write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    report = run_engine(built_demo, tmp_path / "p", "local", sources, **{"ingest.chunk_docs": 7})
    corpus = Paths(tmp_path / "p").corpus
    manifest = read_corpus_manifest(corpus)
    on_disk = sorted(str(p.relative_to(corpus)) for p in corpus.rglob("*.parquet"))
    assert sorted(s.file for s in manifest) == on_disk  # every shard listed once, nothing else written
    read_order = [str(tmp_path / "corpus" / n) for n in ("a.jsonl", "c.jsonl", "d.jsonl", "b.txt", "e.csv")]
    for split in ("train", "validation"):
        shards = [s for s in manifest if s.split == split]
        assert sum(s.rows for s in shards) == report["corpus"][f"{split}_documents"]
        rows = []
        for shard in shards:
            table = pq.read_table(corpus / shard.file)
            assert (shard.rows, shard.characters, shard.words) == (
                table.num_rows,
                pc.sum(table["chars"]).as_py(),
                pc.sum(table["words"]).as_py(),
            )
            assert shard.sha256 == file_digest(corpus / shard.file)
            group, piece = (int(x) for x in Path(shard.file).stem.removeprefix("part-").split("-"))
            files = {read_order.index(s) for s in table["source"].to_pylist()}
            assert files <= [{0}, {1, 2, 3}, {4}][group]  # groups of 7 KB: a.jsonl | c, d, b.txt | e.csv
            rows += [(read_order.index(r["source"]), r["line"], group, piece) for r in table.to_pylist()]
            # a piece closes at the end of the row group that brings it to 7 KB of text, never earlier
            meta = pq.ParquetFile(corpus / shard.file).metadata
            text = table["text"].to_pylist()
            last_group_rows = meta.row_group(meta.num_row_groups - 1).num_rows
            assert sum(len(t.encode()) for t in text[:-last_group_rows]) < SHARD_BYTES
        assert rows == sorted(rows)  # shards in manifest order hold the documents in read order
    train_groups = {int(Path(s.file).stem.split("-")[1]) for s in manifest if s.split == "train"}
    pieces = [s for s in manifest if s.split == "train" and s.file.startswith("train/part-00000-")]
    assert train_groups == {0, 1, 2} and len(pieces) > 1  # the test covers several groups and pieces


def test_readers_name_a_missing_manifest_or_shard(project) -> None:
    _, paths = project
    first = corpus_files(paths.corpus, "train")[0]
    first.unlink()
    with pytest.raises(MissingInput, match=r"listed in manifest\.json but missing"):
        list(iter_corpus_batches(paths.corpus, "train", 100))
    (paths.corpus / MANIFEST).unlink()
    with pytest.raises(MissingInput, match="a corpus older than sharded corpora") as err:
        corpus_files(paths.corpus, "validation")
    assert "ingest" in str(err.value)
    (paths.corpus / MANIFEST).write_text(json.dumps({"shards": [{"split": "train"}]}))
    with pytest.raises(MissingInput, match="not a complete corpus manifest"):
        read_corpus_manifest(paths.corpus)


def test_a_shard_is_read_only_as_the_manifest_promised_it(project) -> None:
    """Issue 61: a shard cut to fewer rows, edited, or cut in half, and a manifest entry that points out of the
    corpus folder, were read (or crashed as internal errors): each is now refused naming the file and the rule."""
    import pyarrow as pa

    from pipeline.core.errors import DataError

    _, paths = project
    first = corpus_files(paths.corpus, "train")[0]
    original, table = first.read_bytes(), pq.read_table(first)

    def refused(rule: str, detail: str) -> None:
        with pytest.raises(DataError, match=detail) as err:
            list(iter_corpus_batches(paths.corpus, "train", 100))
        assert err.value.rule == rule and "re-run" in str(err.value) and "ingest" in str(err.value)

    pq.write_table(table.slice(0, table.num_rows - 5), first)  # 5 documents fewer
    refused("stale-manifest", rf"holds {table.num_rows - 5} rows where manifest\.json records {table.num_rows}")
    texts = table["text"].to_pylist()
    pq.write_table(pa.table({"text": [texts[0][::-1], *texts[1:]]}), first)  # same rows, one text changed
    refused("stale-manifest", "its SHA-256 is not the one manifest.json records")
    first.write_bytes(original[: len(original) // 2])
    refused("corrupt-parquet", "not a readable Parquet file")
    first.write_bytes(original)
    list(iter_corpus_batches(paths.corpus, "train", 100))  # restored: read again
    manifest = json.loads((paths.corpus / MANIFEST).read_text())
    for outside in ("../raw/outside.parquet", "/etc/passwd", "validation/part-00000-000.parquet"):
        changed = {"shards": [{**manifest["shards"][0], "file": outside}, *manifest["shards"][1:]]}
        (paths.corpus / MANIFEST).write_text(json.dumps(changed))
        refused("corrupt-manifest", rf"entry '{outside}' lies outside .*train")


def test_an_empty_validation_split_has_no_shard_and_tokenizes_to_an_empty_one(built_demo, tmp_path: Path) -> None:
    _, demo = built_demo
    paths = Paths(tmp_path)
    shutil.copytree(demo.demo, paths.demo)
    cfg = make_config(**{"ingest.corpus.validation_fraction": 0.0})
    report = ingest.run(cfg, paths).as_json()
    assert report["corpus"]["validation_documents"] == 0 and report["corpus"]["shards"]["validation"] == 0
    assert corpus_files(paths.corpus, "validation") == [] and not (paths.corpus / "validation").exists()
    validate.run(cfg, paths)
    blocks = tokenize.run(cfg, paths).corpus["validation"]
    assert blocks.blocks == 0 and blocks.shards == 1
