"""The corpus half of ingest on Ray Data (``ingest.engine: ray``): the same files, byte for byte, as the local engine.

The per-document work (read, normalise, length filters, 64-bit hash, leakage match, MinHash signature, LSH band
keys, contamination) is :mod:`pipeline.text.corpus`'s and :mod:`pipeline.text.neardup`'s own functions, run as Ray
Data transforms; what depends on other documents runs as the engine's group-bys:

1. **read**: one task per source file (a hub dataset is one), records numbered in read order (``ordinal``:
   file index x 2**40 + position); each is screened on its own.
2. **exact dedup**: a group-by on ``hash mod buckets``; in each group the first copy of a text in read order
   stays, the others are ``duplicate`` (the first one is ``leakage`` when it holds an evaluation text).
3. **near checks** (when on): per document, contamination and the signature with its band keys.
4. **LSH banding**: a group-by on ``band key mod buckets``; a document that shares a band key with another one
   "collides". Only colliding documents can be near-duplicates.
5. **resolution**: the colliding documents' signatures, in read order, go through the local engine's
   :class:`~pipeline.text.neardup.NearDuplicateIndex` in this process (its rule, "near-copies an *earlier kept*
   document", is sequential). Memory: one signature (``num_perm`` x 4 bytes) per colliding document.
6. **write**: every record comes back in read order (a sort on ``ordinal``) and is replayed through the local
   engine's :class:`~pipeline.text.corpus.CorpusBuilder`: the same counts, examples, row groups and files.

Parallelism is per source file: a corpus in one large file is read by one task (split it into files first).
Ray is imported here only, and only when this engine is chosen.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.console import Progress
from pipeline.core.errors import ClusterUnavailable, DataError
from pipeline.text.corpus import (
    CorpusBuilder,
    CorpusStats,
    LeakageGuard,
    NearChecks,
)
from pipeline.text.corpus_rows import (
    Shard,
    hash_column,
    in_sorted,
    later_copies,
    mark_exact,
    near_columns,
    plan_shards,
    replay,
    screen_shard,
    sharing_a_key,
)
from pipeline.text.neardup import NearDuplicateIndex
from pipeline.text.readers import ErrorPolicy

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import IngestConfig
    from pipeline.core.sections.ray import RayConfig


BUCKET_BYTES = 64 << 20  # input bytes per group-by bucket (a group is one UDF call over that many documents' rows)
SKETCHES = pa.schema([("ordinal", pa.int64()), ("hash", pa.uint64()), ("sig", pa.binary()), ("keys", pa.binary())])

# ----------------------------------------------------------------------------- cluster


@contextmanager
def ray_cluster(rc: RayConfig) -> Iterator[dict[str, Any]]:
    """Join ``ray.address`` (or ``RAY_ADDRESS``: a Prefect Ray task runner's cluster), or start a local Ray for the
    block (stopped after it); an already connected one is used. Yields what was joined: ``{"joined": bool, "cpus"}``."""
    import ray

    if ray.is_initialized():
        configure_data_context()
        yield {"joined": True, "cpus": int(ray.cluster_resources().get("CPU", 0))}
        return
    local = not (rc.address or os.environ.get("RAY_ADDRESS"))
    check_reachable(rc.address)
    ray.init(
        address=rc.address or None,
        num_cpus=rc.num_cpus if local else None,
        object_store_memory=rc.object_store_mb * 2**20 if local and rc.object_store_mb else None,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
    )
    try:
        configure_data_context()
        yield {"joined": not local, "cpus": int(ray.cluster_resources().get("CPU", 0))}
    finally:
        ray.shutdown()


def check_reachable(address: str, seconds: float = 5.0) -> None:
    """Fail within ``seconds`` when ``ray.address`` (``host:port`` or ``ray://host:port``) takes no connection;
    ``ray.init`` would wait minutes. Empty and ``auto`` are Ray's to resolve."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not address or address == "auto" or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
        return
    except OSError as err:
        why = err.strerror or type(err).__name__
    # raised outside the handler: the CLI's boundary reads an OSError in the chain as a local disk/OS problem
    raise ClusterUnavailable(
        f"ray.address: no Ray cluster answers at {address} ({why}); start one (`ray start --head`), "
        "fix the address, or leave it empty for a local Ray"
    )


def configure_data_context() -> None:
    """Ray Data without progress bars, its group-bys as sort-based shuffles.

    The sort-based shuffle over tasks ran this module's group-bys 2x faster than the default hash shuffle (whose
    aggregator actors cost seconds to start) on 0.1 GB and 2 cores (``python -m benchmarks.scale``).
    """
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # not a line per dataset executed
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED


def data_error_in(exc: BaseException) -> DataError | None:
    """The :class:`DataError` a Ray task raised, from the exceptions Ray wraps it in (or ``None``)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, DataError):
            return e
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None


# ----------------------------------------------------------------------------- 2. exact dedup (a group-by)


def mark_duplicates(group: pa.Table) -> pa.Table:
    """In one hash bucket: the first copy of each text (read order) stays, or is ``leakage``; the rest ``duplicate``."""
    rows = np.flatnonzero(pc.and_(group["is_doc"], pc.is_null(group["reason"])).to_numpy(zero_copy_only=False))
    duplicate = np.zeros(len(group), dtype=bool)
    if len(rows):
        hashes = hash_column(group)[rows]
        duplicate[rows[later_copies(hashes, group["ordinal"].to_numpy()[rows])]] = True
    return mark_exact(group, duplicate)


# ----------------------------------------------------------------------------- 4. LSH banding (a group-by)


def band_rows(batch: pa.Table, buckets: int) -> pa.Table:
    """One row per (document, band key) of the sketched documents."""
    have = batch.filter(pc.is_valid(batch["keys"]))
    ordinals = have["ordinal"].to_numpy()
    keys = [np.frombuffer(k, dtype=np.uint64) for k in have["keys"].to_pylist()]
    flat = np.concatenate(keys) if keys else np.zeros(0, dtype=np.uint64)
    per_doc = np.repeat(ordinals, [len(k) for k in keys]) if keys else np.zeros(0, dtype=np.int64)
    return pa.table(
        {"key": flat, "ordinal": per_doc, "bucket": (flat % np.uint64(buckets)).astype(np.int64)},
    )


def colliding(group: pa.Table) -> pa.Table:
    """The documents of one band-key bucket that share a key with another document."""
    return pa.table({"ordinal": sharing_a_key(group["key"].to_numpy(), group["ordinal"].to_numpy())})


def sketches_of(batch: pa.Table, wanted: np.ndarray) -> pa.Table:
    """The ``ordinal, hash, sig, keys`` rows of the documents in ``wanted`` (a sorted ordinal array)."""
    return batch.filter(pa.array(in_sorted(batch["ordinal"].to_numpy(), wanted))).select(SKETCHES.names)


def resolve_near_duplicates(sketched: Any, cfg: IngestConfig, buckets: int) -> dict[int, tuple[str, float]]:
    """``ordinal -> (id of the kept document it near-copies, Jaccard)`` for every near-duplicate, as the local rule.

    Only documents that share a band key with another one can be near-duplicates or be near-copied, so the
    local index run over them alone, in read order, decides exactly as it would over every document.
    """
    import ray

    nd, m = cfg.near_duplicates, cfg.minhash
    pairs = sketched.map_batches(band_rows, fn_kwargs={"buckets": buckets}, batch_format="pyarrow")
    hits = pairs.groupby("bucket", num_partitions=buckets).map_groups(colliding, batch_format="pyarrow")
    found = [t["ordinal"].to_numpy() for t in hits.iter_batches(batch_format="pyarrow", batch_size=None)]
    wanted = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    if not len(wanted):
        return {}
    wanted_ref = ray.put(wanted)
    rows = sketched.map_batches(
        lambda batch: sketches_of(batch, ray.get(wanted_ref)), batch_format="pyarrow"
    ).to_arrow_refs()
    table = pa.concat_tables(ray.get(rows)).sort_by("ordinal")
    index = NearDuplicateIndex(nd.threshold, nd.shingle_words, m.num_perm, m.seed)
    sigs = np.frombuffer(b"".join(table["sig"].to_pylist()), dtype=np.uint32).reshape(len(table), m.num_perm)
    keys = np.frombuffer(b"".join(table["keys"].to_pylist()), dtype=np.uint64).reshape(len(table), index.bands)
    ids = [f"{h:016x}" for h in table["hash"].to_pylist()]
    results = index.check_sketches(sigs, keys, ids)
    return {o: r for o, r in zip(table["ordinal"].to_pylist(), results, strict=True) if r is not None}


# ----------------------------------------------------------------------------- the whole


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
    start = time.perf_counter()
    shards = plan_shards(cfg, root)
    buckets = bucket_count(shards)
    evaluation = list(near.evaluation_texts)
    builder = CorpusBuilder(cfg, out_dir, guard, near)
    for shard in shards:
        builder.stats.sources.setdefault(shard.name, Counter())
    progress = Progress("ingest: corpus (ray)", None, "documents")
    try:
        steps = builder.stats.step_seconds
        with ray_cluster(rc) as cluster:
            builder.stats.cluster = cluster
            steps["start"] = time.perf_counter() - start
            rows = run_dataflow(shards, cfg, evaluation, buckets, near.active)
            steps["read_dedup_sketch"] = time.perf_counter() - start - sum(steps.values())
            dups = resolve_near_duplicates(rows, cfg, buckets) if near.duplicates is not None else {}
            steps["banding_resolution"] = time.perf_counter() - start - sum(steps.values())
            ordered = rows.drop_columns(["sig", "keys"]) if near.active else rows
            for batch in ordered.sort("ordinal").iter_batches(batch_format="pyarrow", batch_size=cfg.chunk_docs):
                replay(builder, batch, dups, policy)
                kept = builder.stats.kept
                progress.update(builder.stats.read, kept=kept["train"] + kept["validation"])
            if builder.pending:
                builder.flush()
            steps["sort_and_write"] = time.perf_counter() - start - sum(steps.values())
    except Exception as exc:
        err = data_error_in(exc)
        if err is None or err is exc:
            raise
        raise err from None  # bad input named by file, line and rule, as the local engine names it
    finally:
        builder.close()
        progress.close()
    return builder.stats


def run_dataflow(
    shards: list[Shard], cfg: IngestConfig, evaluation: list[tuple[str, str, str]], buckets: int, near: bool
) -> Any:
    """Steps 1-3 as one Ray dataset: every record screened, exact duplicates marked, near columns added (materialised
    when the near checks are on: banding and the write both read it)."""
    import ray.data

    def read(batch: dict[str, np.ndarray]) -> Iterator[pa.Table]:
        for index in batch["shard"].tolist():
            yield from screen_shard(shards[index], cfg, evaluation, buckets)

    files = ray.data.from_items([{"shard": s.index} for s in shards], override_num_blocks=len(shards))
    screened = files.map_batches(read, batch_size=1, batch_format="numpy")
    deduped = screened.groupby("bucket", num_partitions=buckets).map_groups(mark_duplicates, batch_format="pyarrow")
    if not near:
        return deduped
    checked = deduped.map_batches(
        near_columns, fn_kwargs={"cfg": cfg, "evaluation": evaluation}, batch_format="pyarrow", batch_size=None
    )
    return checked.materialize()
