"""The layout of ``data/corpus/``: each split as Parquet shards, and the manifest that lists them in read order.

``data/corpus/``::

    manifest.json                        {"shards": [{"split", "file", "rows", "characters", "words", "sha256"}]}
    train/part-00000-000.parquet ...     group 0 of the source files, its first piece
    validation/part-00000-000.parquet

A **group** is a run of consecutive source files of about ``ingest.shard_mb`` (a large file is a group of its own;
a hub dataset too): the unit that one process writes, so the two-pass engines write their groups in parallel.
Within a group a split's documents are cut into **pieces** of about ``ingest.shard_mb`` of text each, at a Parquet
row group's end. Groups and pieces follow from the sources and the kept texts only, so every engine writes the same
files. Readers go by the manifest (its order is read order), never by a directory listing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core.io import check_digest, damaged_input, file_digest, listed_file, missing_input, write_json

MANIFEST = "manifest.json"
SPLITS = ("train", "validation")
MB = 1_000_000  # ingest.shard_mb's unit (bytes)


@dataclass(frozen=True)
class CorpusShard:
    """A manifest line: one Parquet shard of a corpus split, its documents, characters, words and content hash."""

    split: str
    file: str  # relative to data/corpus/
    rows: int
    characters: int
    words: int
    sha256: str


def shard_file(split: str, group: int, piece: int) -> str:
    """Where piece ``piece`` of file group ``group`` of ``split`` goes, relative to the corpus folder."""
    return f"{split}/part-{group:05d}-{piece:03d}.parquet"


def file_groups(sizes: list[int | None], group_bytes: int) -> list[int]:
    """The group of each source file (in read order, sizes in bytes; ``None``: unknown, a hub dataset): consecutive
    files join a group until it holds ``group_bytes``; a file of unknown size is a group of its own."""
    groups: list[int] = []
    group, held = -1, group_bytes  # the first file opens group 0
    for size in sizes:
        if size is None or held >= group_bytes:
            group, held = group + 1, 0
        groups.append(group)
        held = group_bytes if size is None else held + size
    return groups


def write_corpus_manifest(corpus_dir: Path, shards: list[CorpusShard]) -> None:
    """``corpus_dir/manifest.json``: the shards, train's then validation's, each split in read order."""
    ordered = [s for split in SPLITS for s in shards if s.split == split]
    write_json(corpus_dir / MANIFEST, {"shards": [asdict(s) for s in ordered]})


def read_corpus_manifest(corpus_dir: Path) -> list[CorpusShard]:
    """The shards ``corpus_dir/manifest.json`` lists; missing or unreadable is a missing input naming ingest."""
    path = corpus_dir / MANIFEST
    if not path.exists():
        raise missing_input(path, "missing (a failed or never-run ingest, or a corpus older than sharded corpora)")
    try:
        return [CorpusShard(**line) for line in json.loads(path.read_text(encoding="utf-8"))["shards"]]
    except (ValueError, KeyError, TypeError) as err:
        raise missing_input(path, f"not a complete corpus manifest ({type(err).__name__}: {str(err)[:120]})") from None


def corpus_shards(corpus_dir: Path, split: str) -> list[CorpusShard]:
    """The shards of ``split`` in read order (none for an empty split), each checked against what the manifest
    promises (:func:`check_shard`); a listed file that is gone is a missing input naming ingest."""
    shards = [s for s in read_corpus_manifest(corpus_dir) if s.split == split]
    for shard in shards:
        check_shard(corpus_dir, shard)
    return shards


def check_shard(corpus_dir: Path, shard: CorpusShard) -> None:
    """The manifest line's file lies inside ``corpus_dir/<split>/`` (never a path out of it), exists, is Parquet,
    and holds the rows and the SHA-256 the manifest records (a shard cut or edited after ingest is refused, not
    read as a smaller corpus). Errors name the file and the rule: ``[corrupt-manifest]``, ``[corrupt-parquet]``,
    ``[stale-manifest]``; each says to re-run ingest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = corpus_dir / MANIFEST
    file = listed_file(corpus_dir, shard.file, shard.split, manifest)
    try:
        rows = pq.ParquetFile(file).metadata.num_rows
    except (pa.ArrowException, OSError) as err:
        raise damaged_input(file, "corrupt-parquet", f"not a readable Parquet file ({str(err)[:120]})") from None
    if rows != shard.rows:
        raise damaged_input(file, "stale-manifest", f"holds {rows} rows where {MANIFEST} records {shard.rows}")
    check_digest(file, shard.sha256, manifest)


def corpus_files(corpus_dir: Path, split: str) -> list[Path]:
    """The Parquet files of ``split``, in read order."""
    return [corpus_dir / s.file for s in corpus_shards(corpus_dir, split)]


def iter_corpus_batches(
    corpus_dir: Path, split: str, batch_docs: int, max_docs: int | None = None
) -> Iterator[list[str]]:
    """Lists of at most ``batch_docs`` document texts of ``split``, shard after shard (the first ``max_docs``)."""
    seen = 0
    for file in corpus_files(corpus_dir, split):
        for texts in iter_shard_batches(file, batch_docs):
            if max_docs is not None:
                texts = texts[: max_docs - seen]
            seen += len(texts)
            if texts:
                yield texts
            if max_docs is not None and seen >= max_docs:
                return


def iter_shard_batches(file: Path, batch_docs: int, row_groups: list[int] | None = None) -> Iterator[list[str]]:
    """Lists of at most ``batch_docs`` texts of one corpus shard (only ``row_groups``, in order, when given)."""
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_docs, columns=["text"], row_groups=row_groups):
        yield batch.column(0).to_pylist()


def write_corpus_texts(corpus_dir: Path, split: str, texts: list[str]) -> CorpusShard:
    """``texts`` as ``split``'s one shard (a corpus made by hand: a study's TAPT text); returns its manifest line
    (write the manifest with :func:`write_corpus_manifest`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = corpus_dir / shard_file(split, 0, 0)
    file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), file)
    words = sum(t.count(" ") + 1 for t in texts if t)
    return CorpusShard(split, shard_file(split, 0, 0), len(texts), sum(map(len, texts)), words, file_digest(file))
