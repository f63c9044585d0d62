"""The two-pass corpus: the local engine with its dedup indexes on disk (``ingest.index: disk``), and the steps the
Ray engine (:mod:`pipeline.text.corpus_ray`) runs on its cluster. Bounded memory for a corpus of any size.

The streamed engine (:func:`pipeline.text.corpus.ingest_corpus`) holds, per kept document, its hash and its entry in
the near-duplicate index (~0.85 KB). This one holds one batch, one partition of pairs and, per document that can be a
near-duplicate at all, a signature; the rest goes to disk (``.adaptbert/ingest-index/``, removed after the run):

1. **read, screen, sketch** (one pass over the sources, in read order; :func:`index_shard` per source file): every
   record becomes a row of :data:`~pipeline.text.corpus_rows.ROWS` (filters, hash, leakage match, contamination),
   spilled to the file's Parquet file; each document's ``(hash, ordinal)`` and ``(band key, ordinal)`` pairs are
   appended to flat files, its MinHash signature to the file's sketch files.
2. **exact duplicates**: the hash pairs, cut into partitions by the hash's top bits (each under
   :data:`PARTITION_BYTES`), each sorted: a text's first ordinal stays, the others are duplicates (8 bytes each).
3. **colliding documents**: the band-key pairs, partitioned the same way without the duplicates'; a document that
   shares a key with another one collides. Only colliding documents can be near-duplicates or be near-copied.
4. **resolution**: the colliding documents' signatures, in read order, through the streamed engine's
   :class:`~pipeline.text.neardup.NearDuplicateIndex` (its sequential rule, "near-copies an *earlier kept*
   document", decided exactly as over every document). Memory: ~0.75 KB per colliding document.
5. **write**, per file group (:mod:`pipeline.text.corpus_shards`; on Ray, one task each, in parallel): the group's
   spilled rows, in read order, replayed through a :class:`~pipeline.text.corpus.CorpusBuilder` of its own; their
   statistics are added up in read order. The same counts, examples, row groups and shards as the streamed
   engine's, byte for byte (tested).

Why not a library: the group-bys are two sorts of integer pairs; DuckDB or Polars would sort them out of core too,
but the decisions in read order (first copy, earlier kept document) are the engine's own, so the pairs would go
back and forth through another engine for a few lines of NumPy here.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.console import Progress
from pipeline.text.corpus import CorpusBuilder, CorpusStats, LeakageGuard, NearChecks
from pipeline.text.corpus_rows import (
    ROWS,
    SHARD_BITS,
    Shard,
    check_rows,
    hash_column,
    in_sorted,
    later_copies,
    mark_exact,
    plan_shards,
    replay,
    screen_shard,
    sharing_a_key,
)
from pipeline.text.neardup import NearDuplicateIndex, band_keys
from pipeline.text.readers import ErrorPolicy

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import IngestConfig

INDEX_DIR = Path(".adaptbert") / "ingest-index"  # under the project root: the same disk as data/, not /tmp
PARTITION_BYTES = 64 << 20  # pairs (16 bytes each) per partition sorted at once: bounds the sort's memory
COPY_PAIRS = 1 << 22  # pairs read at a time while they are cut into partitions (64 MB)
RESOLVE_DOCS = 1 << 14  # colliding documents' signatures read at a time (8 MB at 128 permutations; pages: 64 MB)


class PairFile:
    """``(uint64 key, int64 ordinal)`` pairs appended to two flat files, then read back grouped by key."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name = folder, name
        self.keys_path, self.ordinals_path = folder / f"{name}.keys", folder / f"{name}.ordinals"
        self.keys_file: BinaryIO = self.keys_path.open("wb")
        self.ordinals_file: BinaryIO = self.ordinals_path.open("wb")
        self.count = 0

    def add(self, keys: np.ndarray, ordinals: np.ndarray) -> None:
        self.keys_file.write(np.ascontiguousarray(keys, dtype=np.uint64).tobytes())
        self.ordinals_file.write(np.ascontiguousarray(ordinals, dtype=np.int64).tobytes())
        self.count += len(keys)

    def close(self) -> None:
        self.keys_file.close()
        self.ordinals_file.close()

    def partitions(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every pair, in partitions that each hold all pairs of their keys (``(keys, ordinals)`` arrays); one
        partition in memory at a time, each under ~:data:`PARTITION_BYTES` for keys spread as hashes are."""
        self.close()
        if not self.count:
            return
        bits = max(0, int(np.ceil(np.log2(self.count * 16 / PARTITION_BYTES))))
        if bits == 0:
            yield np.fromfile(self.keys_path, dtype=np.uint64), np.fromfile(self.ordinals_path, dtype=np.int64)
            return
        parts = [
            (self.folder / f"{self.name}.{p}.keys", self.folder / f"{self.name}.{p}.ordinals") for p in range(1 << bits)
        ]
        files = [(k.open("wb"), o.open("wb")) for k, o in parts]
        # read in chunks into memory that is freed after each, not memory-mapped: touched pages of a map count as the
        # process's memory until it is unmapped (2 GB of band-key pairs at 10 GB of corpus)
        with self.keys_path.open("rb") as key_file, self.ordinals_path.open("rb") as ordinal_file:
            try:
                while len(k := np.fromfile(key_file, dtype=np.uint64, count=COPY_PAIRS)):
                    o = np.fromfile(ordinal_file, dtype=np.int64, count=len(k))
                    part = (k >> np.uint64(64 - bits)).astype(np.int64)
                    order = np.argsort(part, kind="stable")
                    bounds = np.searchsorted(part[order], np.arange((1 << bits) + 1))
                    for p, (kf, of) in enumerate(files):
                        rows = order[bounds[p] : bounds[p + 1]]
                        kf.write(k[rows].tobytes())
                        of.write(o[rows].tobytes())
            finally:
                for kf, of in files:
                    kf.close()
                    of.close()
        self.keys_path.unlink()
        self.ordinals_path.unlink()
        for k_path, o_path in parts:
            yield np.fromfile(k_path, dtype=np.uint64), np.fromfile(o_path, dtype=np.int64)
            k_path.unlink()
            o_path.unlink()


class PairBuffer:
    """``(uint64 key, int64 ordinal)`` pairs collected in memory: what a Ray task hands on to the engine's group-bys."""

    def __init__(self) -> None:
        self.keys: list[np.ndarray] = []
        self.ordinals: list[np.ndarray] = []

    def add(self, keys: np.ndarray, ordinals: np.ndarray) -> None:
        self.keys.append(np.asarray(keys, dtype=np.uint64))
        self.ordinals.append(np.asarray(ordinals, dtype=np.int64))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.keys:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        return np.concatenate(self.keys), np.concatenate(self.ordinals)


PairSink = PairFile | PairBuffer


class Sketches:
    """One source file's sketched documents, in read order, in flat files: signatures, hashes and ordinals."""

    def __init__(self, folder: Path, shard: int) -> None:
        self.files = {name: sketch_path(folder, shard, name).open("wb") for name in ("sigs", "hashes", "ordinals")}

    def add(self, sigs: np.ndarray, hashes: np.ndarray, ordinals: np.ndarray) -> None:
        self.files["sigs"].write(np.ascontiguousarray(sigs, dtype=np.uint32).tobytes())
        self.files["hashes"].write(np.ascontiguousarray(hashes, dtype=np.uint64).tobytes())
        self.files["ordinals"].write(np.ascontiguousarray(ordinals, dtype=np.int64).tobytes())

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def sketch_path(folder: Path, shard: int, name: str) -> Path:
    return folder / f"sketch-{shard:06d}.{name}"


def spill_path(folder: Path, shard: int) -> Path:
    return folder / f"rows-{shard:06d}.parquet"


def sketched_rows(
    folder: Path, num_perm: int, wanted: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(ordinals, signatures, hashes)`` of the documents ``wanted`` (sorted ordinals, every one sketched), in read
    order, at most :data:`RESOLVE_DOCS` at a time."""
    shard_of = wanted >> SHARD_BITS
    for shard in np.unique(shard_of).tolist():
        mine = wanted[shard_of == shard]
        rows = np.searchsorted(np.fromfile(sketch_path(folder, shard, "ordinals"), dtype=np.int64), mine)
        for start in range(0, len(mine), RESOLVE_DOCS):
            at = rows[start : start + RESOLVE_DOCS]
            # a map per chunk, dropped after it: its touched pages (~4 KB per signature read) count as memory while
            # it is mapped
            sigs = np.memmap(sketch_path(folder, shard, "sigs"), dtype=np.uint32, mode="r").reshape(-1, num_perm)
            hashes = np.memmap(sketch_path(folder, shard, "hashes"), dtype=np.uint64, mode="r")
            yield mine[start : start + RESOLVE_DOCS], np.array(sigs[at]), np.array(hashes[at])
            del sigs, hashes


def ingest_corpus_disk(
    cfg: IngestConfig, out_dir: Path, guard: LeakageGuard, near: NearChecks, policy: ErrorPolicy, root: Path
) -> CorpusStats:
    """:func:`pipeline.text.corpus.ingest_corpus` with its indexes on disk: the same statistics and Parquet files."""
    folder = fresh_index_dir(root)
    stats = CorpusStats()
    steps = stats.step_seconds
    start = time.perf_counter()
    try:
        shards = plan_shards(cfg, root)
        exact, bands = PairFile(folder, "exact"), PairFile(folder, "bands")
        progress = Progress("ingest: corpus (pass 1 of 2)", None, "records")
        for shard in shards:
            stats.sources.setdefault(shard.name, Counter())
            index_shard(shard, cfg, near, folder, exact, bands, progress)
        progress.close()
        steps["read_screen_sketch"] = time.perf_counter() - start
        duplicates = exact_duplicates(exact.partitions())
        wanted = colliding_documents(bands.partitions(), duplicates) if near.duplicates is not None else None
        steps["dedup_banding"] = time.perf_counter() - start - sum(steps.values())
        dups = resolve(wanted, folder, cfg) if wanted is not None else {}
        steps["resolution"] = time.perf_counter() - start - sum(steps.values())
        decided = Decisions(duplicates, dups)
        parts = (
            write_group(cfg, out_dir, members, folder, decided.of(members), guard, near, policy.mode)
            for members in file_groups_of(shards)
        )
        merge_groups(stats, policy, parts, near.examples)
        steps["write"] = time.perf_counter() - start - sum(steps.values())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return stats


def fresh_index_dir(root: Path) -> Path:
    """``.adaptbert/ingest-index/`` of the project, emptied (a killed run may have left files there); absolute, so
    that Ray tasks running elsewhere find it."""
    folder = (root / INDEX_DIR).absolute()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def index_shard(
    shard: Shard,
    cfg: IngestConfig,
    near: NearChecks,
    folder: Path,
    exact: PairSink,
    bands: PairSink,
    progress: Progress | None = None,
) -> None:
    """Step 1 for one source file: its records as rows (spilled, read order), its documents' hash and band-key pairs
    to ``exact`` and ``bands``, their signatures to the file's sketch files."""
    sketches = Sketches(folder, shard.index)
    try:
        with pq.ParquetWriter(spill_path(folder, shard.index), ROWS) as writer:
            for block in screen_shard(shard, cfg, list(near.evaluation_texts)):
                table = index_rows(block, near, exact, bands, sketches)
                writer.write_table(table)
                if progress is not None:
                    progress.update(progress.done + len(table))
    finally:
        sketches.close()


def index_rows(table: pa.Table, near: NearChecks, exact: PairSink, bands: PairSink, sketches: Sketches) -> pa.Table:
    """One batch of rows: its documents' hash pairs, band-key pairs and signatures added; contamination filled in."""
    docs = pc.and_(table["is_doc"], pc.is_null(table["reason"])).to_numpy(zero_copy_only=False)
    hashes, ordinals = hash_column(table), table["ordinal"].to_numpy()
    exact.add(hashes[docs], ordinals[docs])
    if not near.active:
        return table
    # a document holding an evaluation text is dropped whatever it near-copies: not checked
    live = np.flatnonzero(docs & pc.is_null(table["leak_task"]).to_numpy(zero_copy_only=False))
    table, sketch = check_rows(table, live, near)
    if sketch is not None:
        sigs, keys = sketch
        sketches.add(sigs, hashes[live], ordinals[live])
        bands.add(keys.reshape(-1), np.repeat(ordinals[live], keys.shape[1]))
    return table


def exact_duplicates(partitions: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Step 2: the ordinals (sorted) of the documents whose text an earlier document has too, from ``(hash,
    ordinal)`` pairs in partitions that each hold every pair of their hashes."""
    found = [ordinals[later_copies(keys, ordinals)] for keys, ordinals in partitions]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def colliding_documents(partitions: Iterable[tuple[np.ndarray, np.ndarray]], duplicates: np.ndarray) -> np.ndarray:
    """Step 3: the documents (sorted ordinals) that share a band key with another one, exact duplicates left out,
    from ``(band key, ordinal)`` pairs in partitions that each hold every pair of their keys."""
    found = [sharing_a_key(*without(keys, ordinals, duplicates)) for keys, ordinals in partitions]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def without(keys: np.ndarray, ordinals: np.ndarray, dropped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs whose ordinal is not in ``dropped`` (sorted)."""
    kept = ~in_sorted(ordinals, dropped)
    return keys[kept], ordinals[kept]


def resolve(wanted: np.ndarray, folder: Path, cfg: IngestConfig) -> dict[int, tuple[str, float]]:
    """Step 4: ``ordinal -> (id of the kept document it near-copies, Jaccard)`` for every near-duplicate among the
    colliding documents ``wanted``, decided in read order as the streamed engine decides."""
    nd, m = cfg.near_duplicates, cfg.minhash
    index = NearDuplicateIndex(nd.threshold, nd.shingle_words, m.num_perm, m.seed)
    dups: dict[int, tuple[str, float]] = {}
    for ordinals, sigs, hashes in sketched_rows(folder, m.num_perm, wanted):
        ids = [f"{h:016x}" for h in hashes.tolist()]
        results = index.check_sketches(sigs, band_keys(sigs, index.bands, index.rows), ids)
        dups.update((o, r) for o, r in zip(ordinals.tolist(), results, strict=True) if r is not None)
    return dups


class Decisions:
    """What steps 2-4 decided, handed out per file group: the exact duplicates' ordinals (sorted) and the
    near-duplicates' ``ordinal -> (id of the kept document it near-copies, Jaccard)``."""

    def __init__(self, duplicates: np.ndarray, dups: dict[int, tuple[str, float]]) -> None:
        self.duplicates, self.dups = duplicates, dups
        self.near = np.array(sorted(dups), dtype=np.int64)

    def of(self, members: list[Shard]) -> tuple[np.ndarray, dict[int, tuple[str, float]]]:
        """The decisions on the documents of the files ``members`` (consecutive)."""
        lo, hi = members[0].index << SHARD_BITS, (members[-1].index + 1) << SHARD_BITS
        exact = self.duplicates[np.searchsorted(self.duplicates, lo) : np.searchsorted(self.duplicates, hi)]
        near = self.near[np.searchsorted(self.near, lo) : np.searchsorted(self.near, hi)]
        return exact, {o: self.dups[o] for o in near.tolist()}


def file_groups_of(shards: list[Shard]) -> list[list[Shard]]:
    """The source files cut into their file groups, in read order."""
    groups: list[list[Shard]] = []
    for shard in shards:
        if not groups or groups[-1][0].group != shard.group:
            groups.append([])
        groups[-1].append(shard)
    return groups


def write_group(
    cfg: IngestConfig,
    out_dir: Path,
    members: list[Shard],
    folder: Path,
    decided: tuple[np.ndarray, dict[int, tuple[str, float]]],
    guard: LeakageGuard,
    near: NearChecks,
    on_error: str,
) -> tuple[CorpusStats, ErrorPolicy]:
    """Step 5 for one file group (a task of its own on Ray): its files' spilled rows, in read order, with the exact
    and near decisions ``decided``, through a builder of their own; their statistics, shards and skipped errors."""
    duplicates, dups = decided
    builder = CorpusBuilder(cfg, out_dir, guard, near)
    policy = ErrorPolicy(on_error)
    try:
        for shard in members:
            builder.stats.sources.setdefault(shard.name, Counter())
            for batch in pq.ParquetFile(spill_path(folder, shard.index)).iter_batches(batch_size=cfg.chunk_docs):
                table = pa.Table.from_batches([batch], schema=ROWS)
                exact = mark_exact(table, in_sorted(table["ordinal"].to_numpy(), duplicates))
                replay(builder, exact, shard.group, dups, policy)
        if builder.pending:
            builder.flush()
    finally:
        builder.close()
    return builder.stats, policy


def merge_groups(
    stats: CorpusStats, policy: ErrorPolicy, parts: Iterable[tuple[CorpusStats, ErrorPolicy]], examples: int
) -> None:
    """Each file group's statistics and skipped errors (in read order) added to the whole corpus's."""
    progress = Progress("ingest: corpus (pass 2 of 2)", None, "documents")
    for part, errors in parts:
        stats.merge(part, examples)
        policy.merge(errors)
        progress.update(stats.read, kept=stats.kept["train"] + stats.kept["validation"])
    progress.close()
