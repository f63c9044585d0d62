"""The local engine with its dedup indexes on disk (``ingest.index: disk``): bounded memory for a corpus of any size.

The streamed engine (:func:`pipeline.text.corpus.ingest_corpus`) holds, per kept document, its hash and its entry in
the near-duplicate index (~0.85 KB). This one holds one batch, one partition of pairs and, per document that can be a
near-duplicate at all, a signature; the rest goes to disk (``.adaptbert/ingest-index/``, removed after the run):

1. **read, screen, sketch** (one pass over the sources, in read order): every record becomes a row of
   :data:`~pipeline.text.corpus_rows.ROWS` (the Ray engine's rows: filters, hash, leakage match, contamination),
   spilled to a Parquet file; each document's ``(hash, ordinal)`` and ``(band key, ordinal)`` pairs are appended to
   flat files, its MinHash signature to another.
2. **exact duplicates**: the hash pairs, cut into partitions by the hash's top bits (each under
   :data:`PARTITION_BYTES`), each sorted: a text's first ordinal stays, the others are duplicates (8 bytes each).
3. **colliding documents**: the band-key pairs, partitioned the same way without the duplicates'; a document that
   shares a key with another one collides. Only colliding documents can be near-duplicates or be near-copied.
4. **resolution**: the colliding documents' signatures, in read order, through the streamed engine's
   :class:`~pipeline.text.neardup.NearDuplicateIndex` (its sequential rule, "near-copies an *earlier kept*
   document", decided exactly as over every document; the Ray engine's step 5). Memory: ~0.75 KB per colliding one.
5. **write**: the spilled rows, in read order, replayed through :class:`~pipeline.text.corpus.CorpusBuilder`: the
   same counts, examples, row groups and files as the streamed engine's, byte for byte (tested).

Why not a library: the group-bys are two sorts of integer pairs; DuckDB or Polars would sort them out of core too,
but the decisions in read order (first copy, earlier kept document) are the engine's own, so the pairs would go
back and forth through another engine for a few lines of NumPy here.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterator
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
RESOLVE_DOCS = 1 << 16  # colliding documents' signatures read at a time (32 MB at 128 permutations)


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
        keys = np.memmap(self.keys_path, dtype=np.uint64, mode="r")
        ordinals = np.memmap(self.ordinals_path, dtype=np.int64, mode="r")
        bits = max(0, int(np.ceil(np.log2(self.count * 16 / PARTITION_BYTES))))
        if bits == 0:
            yield np.array(keys), np.array(ordinals)
            return
        parts = [
            (self.folder / f"{self.name}.{p}.keys", self.folder / f"{self.name}.{p}.ordinals") for p in range(1 << bits)
        ]
        files = [(k.open("wb"), o.open("wb")) for k, o in parts]
        try:
            for start in range(0, self.count, COPY_PAIRS):
                k, o = np.array(keys[start : start + COPY_PAIRS]), np.array(ordinals[start : start + COPY_PAIRS])
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
        del keys, ordinals
        self.keys_path.unlink()
        self.ordinals_path.unlink()
        for k_path, o_path in parts:
            yield np.fromfile(k_path, dtype=np.uint64), np.fromfile(o_path, dtype=np.int64)
            k_path.unlink()
            o_path.unlink()


class Sketches:
    """The signatures and hashes of the sketched documents, in read order, in flat files (row ``i``: ``ordinals[i]``)."""

    def __init__(self, folder: Path, num_perm: int) -> None:
        self.folder, self.num_perm = folder, num_perm
        self.files = {name: (folder / f"sketch.{name}").open("wb") for name in ("sigs", "hashes", "ordinals")}
        self.count = 0

    def add(self, sigs: np.ndarray, hashes: np.ndarray, ordinals: np.ndarray) -> None:
        self.files["sigs"].write(np.ascontiguousarray(sigs, dtype=np.uint32).tobytes())
        self.files["hashes"].write(np.ascontiguousarray(hashes, dtype=np.uint64).tobytes())
        self.files["ordinals"].write(np.ascontiguousarray(ordinals, dtype=np.int64).tobytes())
        self.count += len(ordinals)

    def rows_of(self, wanted: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(ordinals, signatures, hashes)`` of the documents ``wanted`` (sorted ordinals), a few thousand at a time."""
        for f in self.files.values():
            f.close()
        if not self.count or not len(wanted):
            return
        ordinals = np.memmap(self.folder / "sketch.ordinals", dtype=np.int64, mode="r")
        hashes = np.memmap(self.folder / "sketch.hashes", dtype=np.uint64, mode="r")
        sigs = np.memmap(self.folder / "sketch.sigs", dtype=np.uint32, mode="r").reshape(self.count, self.num_perm)
        for start in range(0, len(wanted), RESOLVE_DOCS):
            chunk = wanted[start : start + RESOLVE_DOCS]
            rows = np.searchsorted(ordinals, chunk)  # every wanted ordinal was sketched
            yield chunk, np.array(sigs[rows]), np.array(hashes[rows])


def ingest_corpus_disk(
    cfg: IngestConfig, out_dir: Path, guard: LeakageGuard, near: NearChecks, policy: ErrorPolicy, root: Path
) -> CorpusStats:
    """:func:`pipeline.text.corpus.ingest_corpus` with its indexes on disk: the same statistics and Parquet files."""
    folder = root / INDEX_DIR
    shutil.rmtree(folder, ignore_errors=True)  # what a killed run left
    folder.mkdir(parents=True)
    builder = CorpusBuilder(cfg, out_dir, guard, near)
    steps = builder.stats.step_seconds
    start = time.perf_counter()
    try:
        spill, exact, bands, sketches = read_and_sketch(cfg, near, root, folder, builder.stats)
        steps["read_screen_sketch"] = time.perf_counter() - start
        duplicates = exact_duplicates(exact)
        dups = resolve(colliding_documents(bands, duplicates), sketches, cfg) if near.duplicates is not None else {}
        steps["dedup_banding_resolution"] = time.perf_counter() - start - sum(steps.values())
        write(builder, spill, duplicates, dups, policy, cfg.chunk_docs)
        steps["write"] = time.perf_counter() - start - sum(steps.values())
    finally:
        builder.close()
        shutil.rmtree(folder, ignore_errors=True)
    return builder.stats


def read_and_sketch(
    cfg: IngestConfig, near: NearChecks, root: Path, folder: Path, stats: CorpusStats
) -> tuple[Path, PairFile, PairFile, Sketches]:
    """Step 1: every record as a row (spilled, read order); hash pairs, band-key pairs and signatures to flat files."""
    spill = folder / "rows.parquet"
    exact, bands = PairFile(folder, "exact"), PairFile(folder, "bands")
    sketches = Sketches(folder, cfg.minhash.num_perm)
    shards = plan_shards(cfg, root)
    for shard in shards:
        stats.sources.setdefault(shard.name, Counter())
    evaluation = list(near.evaluation_texts)
    progress = Progress("ingest: corpus (pass 1 of 2)", None, "records")
    seen = 0
    with pq.ParquetWriter(spill, ROWS) as writer:
        for shard in shards:
            for block in screen_shard(shard, cfg, evaluation, buckets=1):
                for start in range(0, len(block), cfg.chunk_docs):  # the streamed engine's batch: the same memory
                    table = index_rows(block.slice(start, cfg.chunk_docs), near, exact, bands, sketches)
                    writer.write_table(table)
                    seen += len(table)
                    progress.update(seen)
    progress.close()
    return spill, exact, bands, sketches


def index_rows(table: pa.Table, near: NearChecks, exact: PairFile, bands: PairFile, sketches: Sketches) -> pa.Table:
    """One batch of rows: its documents' hash pairs, band-key pairs and signatures appended; contamination filled in."""
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


def exact_duplicates(exact: PairFile) -> np.ndarray:
    """Step 2: the ordinals (sorted) of the documents whose text an earlier document has too."""
    found = [ordinals[later_copies(keys, ordinals)] for keys, ordinals in exact.partitions()]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def colliding_documents(bands: PairFile, duplicates: np.ndarray) -> np.ndarray:
    """Step 3: the documents (sorted ordinals) that share a band key with another one, exact duplicates left out."""
    found: list[np.ndarray] = []
    for keys, ordinals in bands.partitions():
        kept = ~in_sorted(ordinals, duplicates)
        keys, ordinals = keys[kept], ordinals[kept]
        found.append(sharing_a_key(keys, ordinals))
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def resolve(wanted: np.ndarray, sketches: Sketches, cfg: IngestConfig) -> dict[int, tuple[str, float]]:
    """Step 4: ``ordinal -> (id of the kept document it near-copies, Jaccard)`` for every near-duplicate."""
    nd, m = cfg.near_duplicates, cfg.minhash
    index = NearDuplicateIndex(nd.threshold, nd.shingle_words, m.num_perm, m.seed)
    dups: dict[int, tuple[str, float]] = {}
    for ordinals, sigs, hashes in sketches.rows_of(wanted):
        results = index.check_sketches(
            sigs, band_keys(sigs, index.bands, index.rows), [f"{h:016x}" for h in hashes.tolist()]
        )
        dups.update((o, r) for o, r in zip(ordinals.tolist(), results, strict=True) if r is not None)
    return dups


def write(
    builder: CorpusBuilder,
    spill: Path,
    duplicates: np.ndarray,
    dups: dict[int, tuple[str, float]],
    policy: ErrorPolicy,
    batch_rows: int,
) -> None:
    """Step 5: the spilled rows, in read order, with their exact-dedup reasons, through the builder."""
    progress = Progress("ingest: corpus (pass 2 of 2)", None, "documents")
    for batch in pq.ParquetFile(spill).iter_batches(batch_size=batch_rows):
        table = pa.Table.from_batches([batch], schema=ROWS)
        table = mark_exact(table, in_sorted(table["ordinal"].to_numpy(), duplicates))
        replay(builder, table, dups, policy)
        kept = builder.stats.kept
        progress.update(builder.stats.read, kept=kept["train"] + kept["validation"])
    if builder.pending:
        builder.flush()
    progress.close()
