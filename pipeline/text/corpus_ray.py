"""The corpus half of ingest on Ray Data (``ingest.engine: ray``): the same files, byte for byte, as the local engine.

The work is :mod:`pipeline.text.corpus_disk`'s two passes, with the per-file work as Ray tasks and the group-bys as
the engine's shuffles:

1. **read, screen, sketch**: one task per source file (a hub dataset is one) runs the local engine's step 1 for its
   file: its records as rows (numbered in read order, ``ordinal``: file index x 2**40 + position; filters, hash,
   leakage match, contamination) spilled to ``.adaptbert/ingest-index/rows-<file>.parquet``, its signatures to the
   file's sketch files; it hands on only its documents' ``(hash, ordinal)`` and ``(band key, ordinal)`` pairs.
2. **exact dedup**: a group-by of the hash pairs on ``hash mod buckets``; in each group the first copy of a text in
   read order stays, the others are duplicates (8 bytes each to this process).
3. **LSH banding**: a group-by of the band-key pairs (the duplicates' dropped) on ``band key mod buckets``; a
   document that shares a band key with another one "collides". Only colliding documents can be near-duplicates.
4. **resolution** (this process): the colliding documents' signatures, read from the sketch files in read order,
   through the local engine's :class:`~pipeline.text.neardup.NearDuplicateIndex` (its rule, "near-copies an
   *earlier kept* document", is sequential). Memory: ~0.75 KB per colliding document.
5. **write**: one task per file group (:mod:`pipeline.text.corpus_shards`) replays its files' spilled rows (already
   in read order: no sort) through a :class:`~pipeline.text.corpus.CorpusBuilder` of its own and writes the group's
   shards; this process adds up their statistics in read order. The same counts, examples, row groups and files.

The text never enters Ray's object store: only the pairs (~240 bytes per document) are shuffled. Tasks write their
spills into the project, so on a cluster every node must see it (a shared filesystem, as for ``tokenize.engine:
ray``). Parallelism is per source file: a corpus in one large file is read by one task (split it into files first).
Ray is imported here only, and only when this engine is chosen.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.text.corpus import CorpusStats, LeakageGuard, NearChecks
from pipeline.text.corpus_disk import (
    Decisions,
    PairBuffer,
    file_groups_of,
    fresh_index_dir,
    index_shard,
    merge_groups,
    resolve,
    write_group,
)
from pipeline.text.corpus_rows import (
    Shard,
    cached_guard,
    cached_near,
    in_sorted,
    later_copies,
    plan_shards,
    sharing_a_key,
)
from pipeline.text.ray_cluster import data_error_in, ray_cluster
from pipeline.text.readers import ErrorPolicy

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import IngestConfig
    from pipeline.core.sections.ray import RayConfig


BUCKET_BYTES = 256 << 20  # input bytes per group-by bucket: their documents' pairs (~1/4 of it) are one UDF call

# ----------------------------------------------------------------------------- 1-3: per-file tasks, two group-bys


def pair_table(keys: np.ndarray, ordinals: np.ndarray, buckets: int) -> pa.Table:
    """Pairs as a table with their group-by bucket (``key mod buckets``)."""
    return pa.table({"key": keys, "ordinal": ordinals, "bucket": (keys % np.uint64(buckets)).astype(np.int64)})


def index_file(
    batch: dict[str, np.ndarray], shards: list[Shard], cfg: IngestConfig, evaluation: list[tuple[str, str, str]],
    folder: Path, buckets: int,
) -> Iterator[pa.Table]:  # fmt: skip
    """Step 1 for each file of ``batch`` (a task): spill and sketch it; hand on its pairs, ``kind`` 0 the hash
    pairs, 1 the band-key pairs."""
    near = cached_near(cfg, evaluation)
    for index in batch["shard"].tolist():
        exact, bands = PairBuffer(), PairBuffer()
        index_shard(shards[index], cfg, near, folder, exact, bands)
        for kind, sink in enumerate((exact, bands)):
            table = pair_table(*sink.arrays(), buckets)
            yield table.append_column("kind", pa.array(np.full(len(table), kind, dtype=np.int8)))


def later_copies_in(group: pa.Table) -> pa.Table:
    """The ordinals of one hash bucket's exact duplicates (not the first copy in read order)."""
    ordinals = group["ordinal"].to_numpy()
    return pa.table({"ordinal": ordinals[later_copies(group["key"].to_numpy(), ordinals)]})


def colliding_in(group: pa.Table) -> pa.Table:
    """The documents of one band-key bucket that share a key with another document."""
    return pa.table({"ordinal": sharing_a_key(group["key"].to_numpy(), group["ordinal"].to_numpy())})


def drop_duplicates(batch: pa.Table, duplicates: Any) -> pa.Table:
    """The band-key pairs of documents that are no exact duplicate (``duplicates``: a Ray reference to them)."""
    import ray

    return batch.filter(pa.array(~in_sorted(batch["ordinal"].to_numpy(), ray.get(duplicates))))


def ordinals_of(dataset: Any) -> np.ndarray:
    """The ``ordinal`` column of a (small) dataset, sorted and distinct, in this process."""
    found = [t["ordinal"].to_numpy() for t in dataset.iter_batches(batch_format="pyarrow", batch_size=None)]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)


def bucket_count(shards: list[Shard]) -> int:
    """Group-by buckets: one per :data:`BUCKET_BYTES` of input (a hub dataset counts as one bucket's worth)."""
    size = sum(s.path.stat().st_size if s.path is not None else BUCKET_BYTES for s in shards)
    return max(1, -(-size // BUCKET_BYTES))


def ingest_corpus_ray(
    cfg: IngestConfig,
    rc: RayConfig,
    out_dir: Path,
    guard: LeakageGuard,
    near: NearChecks,
    policy: ErrorPolicy,
    root: Path,
) -> CorpusStats:
    """:func:`pipeline.text.corpus.ingest_corpus` on Ray Data: the same statistics and the same Parquet files."""
    import ray
    import ray.data

    start = time.perf_counter()
    shards = plan_shards(cfg, root)
    buckets = bucket_count(shards)
    folder = fresh_index_dir(root)
    stats = CorpusStats()
    for shard in shards:
        stats.sources.setdefault(shard.name, Counter())
    steps = stats.step_seconds
    try:
        with ray_cluster(rc) as cluster:
            stats.cluster = cluster
            steps["start"] = time.perf_counter() - start
            evaluation = list(near.evaluation_texts)
            files = ray.data.from_items([{"shard": s.index} for s in shards], override_num_blocks=len(shards))
            kwargs = {"shards": shards, "cfg": cfg, "evaluation": evaluation, "folder": folder}
            pairs = files.map_batches(
                index_file, fn_kwargs={**kwargs, "buckets": buckets}, batch_size=1, batch_format="numpy"
            ).materialize()
            steps["read_screen_sketch"] = time.perf_counter() - start - sum(steps.values())
            exact = pairs.filter(expr="kind == 0").groupby("bucket", num_partitions=buckets)
            duplicates = ordinals_of(exact.map_groups(later_copies_in, batch_format="pyarrow"))
            wanted = None
            if near.duplicates is not None:
                bands = pairs.filter(expr="kind == 1").map_batches(
                    drop_duplicates, fn_kwargs={"duplicates": ray.put(duplicates)}, batch_format="pyarrow"
                )
                grouped = bands.groupby("bucket", num_partitions=buckets)
                wanted = ordinals_of(grouped.map_groups(colliding_in, batch_format="pyarrow"))
            del pairs
            steps["dedup_banding"] = time.perf_counter() - start - sum(steps.values())
            dups = resolve(wanted, folder, cfg) if wanted is not None else {}
            steps["resolution"] = time.perf_counter() - start - sum(steps.values())
            decided = Decisions(duplicates, dups)
            task = ray.remote(write_group_task)
            refs = [
                task.remote(cfg, out_dir.absolute(), members, folder, decided.of(members), evaluation, policy.mode)
                for members in file_groups_of(shards)
            ]
            merge_groups(stats, policy, (ray.get(ref) for ref in refs), near.examples)
            steps["write"] = time.perf_counter() - start - sum(steps.values())
        steps["stop"] = time.perf_counter() - start - sum(steps.values())  # a local Ray's shutdown
    except Exception as exc:
        err = data_error_in(exc)
        if err is None or err is exc:
            raise
        raise err from None  # bad input named by file, line and rule, as the local engine names it
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return stats


def write_group_task(
    cfg: IngestConfig,
    out_dir: Path,
    members: list[Shard],
    folder: Path,
    decided: tuple[np.ndarray, dict[int, tuple[str, float]]],
    evaluation: list[tuple[str, str, str]],
    on_error: str,
) -> tuple[CorpusStats, ErrorPolicy]:
    """Step 5 for one file group, as a Ray task: :func:`pipeline.text.corpus_disk.write_group` with this worker's
    leakage guard and near checks."""
    guard, near = cached_guard(evaluation, cfg.leakage_min_chars), cached_near(cfg, evaluation)
    return write_group(cfg, out_dir, members, folder, decided, guard, near, on_error)
