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
from dataclasses import dataclass
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
    Pending,
    iter_shard_texts,
    screen,
    shards_of,
    wrong_type,
)
from pipeline.text.neardup import Contamination, NearDuplicateIndex, words_of
from pipeline.text.readers import ErrorPolicy
from pipeline.text.textnorm import text_hash

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import IngestConfig
    from pipeline.core.sections.ray import RayConfig

SHARD_BITS = 40  # ordinal = file index << 40 | record position: 2**40 records per file, 2**23 files
BUCKET_BYTES = 64 << 20  # input bytes per group-by bucket (a group is one UDF call over that many documents' rows)
BLOCK_ROWS = 20_000  # rows per block a read task hands on (~20 MB): a shuffle moves (blocks x buckets) objects

ROWS = pa.schema(
    [
        ("ordinal", pa.int64()),  # read order: file index << SHARD_BITS | position in the file
        ("bucket", pa.int64()),  # the exact-dedup group (hash mod buckets)
        ("source", pa.string()),
        ("line", pa.int64()),
        ("is_doc", pa.bool_()),  # a record that counts as read (an unreadable one is an error row only)
        ("text", pa.string()),  # normalised; null once the document is dropped
        ("words", pa.int32()),
        ("hash", pa.uint64()),
        ("reason", pa.string()),  # why it is dropped (null: still in)
        ("error_file", pa.string()),  # a bad record under on_error: skip
        ("error_line", pa.int64()),
        ("error_rule", pa.string()),
        ("error_detail", pa.string()),
        ("leak_task", pa.string()),  # the evaluation text it holds an exact copy of (leakage guard)
        ("leak_split", pa.string()),
        ("leak_text", pa.string()),
        ("hit_task", pa.string()),  # the evaluation sentence it near-copies (decontamination)
        ("hit_split", pa.string()),
        ("hit_evaluation", pa.string()),
        ("hit_sentence", pa.string()),
        ("hit_jaccard", pa.float64()),
    ]
)
SKETCHES = pa.schema([("ordinal", pa.int64()), ("hash", pa.uint64()), ("sig", pa.binary()), ("keys", pa.binary())])


@dataclass(frozen=True)
class Shard:
    """One file (or hub dataset) of a corpus source: the unit of read parallelism."""

    index: int
    source: int  # its source's position in ingest.corpus.sources
    name: str  # as the local engine names it (relative to where the stage runs, if the params path is)
    path: Path | None  # absolute


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


# ----------------------------------------------------------------------------- 1. read and screen (per file)


class RecordingPolicy(ErrorPolicy):
    """An :class:`ErrorPolicy` that also keeps each skipped error, so that it goes into the rows in read order, and
    names the file as the local engine does (tasks open it by its absolute path: a worker's directory is not ours)."""

    def __init__(self, mode: str, opened: str, name: str) -> None:
        super().__init__(mode)
        self.pending: list[DataError] = []
        self.opened, self.name = opened, name

    def handle(self, err: DataError) -> None:
        if self.opened != self.name:
            err = DataError(
                err.path.replace(self.opened, self.name), err.line, err.rule, err.detail.replace(self.opened, self.name)
            )
        super().handle(err)  # raises under fail
        self.pending.append(err)


class RowBuffer:
    """Rows of :data:`ROWS` (a column left out is null), handed out as Arrow tables."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, **values: Any) -> None:
        self.rows.append(values)

    def table(self) -> pa.Table:
        columns = {name: [row.get(name) for row in self.rows] for name in ROWS.names}  # 10x Table.from_pylist's speed
        self.rows = []
        return pa.Table.from_pydict(columns, schema=ROWS)


_GUARDS: dict[int, LeakageGuard] = {}  # per worker process: built once from the evaluation texts


def cached_guard(evaluation: list[tuple[str, str, str]], min_chars: int) -> LeakageGuard:
    key = hash((tuple(evaluation), min_chars))
    if key not in _GUARDS:
        _GUARDS.clear()
        _GUARDS[key] = LeakageGuard(evaluation, min_chars)
    return _GUARDS[key]


def screen_shard(
    shard: Shard, cfg: IngestConfig, evaluation: list[tuple[str, str, str]], buckets: int
) -> Iterator[pa.Table]:
    """Every record of one file as a row: screened on its own (filters, hash, leakage match); a table per block."""
    guard = cached_guard(evaluation, cfg.leakage_min_chars)
    policy = RecordingPolicy(cfg.on_error, str(shard.path or shard.name), shard.name)  # a hub dataset: no path
    source = cfg.corpus.sources[shard.source]
    rows = RowBuffer()
    position = 0

    def errors() -> None:
        nonlocal position
        for err in policy.pending:
            ordinal = shard.index << SHARD_BITS | position
            rows.add(
                ordinal=ordinal,
                bucket=ordinal % buckets,
                source=shard.name,
                line=err.line,
                is_doc=False,
                error_file=err.path,
                error_line=err.line,
                error_rule=err.rule,
                error_detail=err.detail,
            )
            position += 1
        policy.pending.clear()

    for line, raw in iter_shard_texts(cfg, source, shard.name, shard.path, policy):
        errors()
        ordinal = shard.index << SHARD_BITS | position
        position += 1
        row: dict[str, Any] = {"ordinal": ordinal, "source": shard.name, "line": line, "is_doc": True}
        bad = wrong_type(raw, shard.name, line)
        if bad is not None:
            policy.handle(bad)
            policy.pending.clear()
            rows.add(**row, bucket=ordinal % buckets, reason="bad_record", **error_columns(bad))
        else:
            text, words, reason = screen(raw, cfg)
            if reason is None:
                h = text_hash(text)
                leak = guard.match(text)
                task, split, copy = leak if leak is not None else (None, None, None)
                rows.add(
                    **row, bucket=h % buckets, text=text, words=words, hash=h, leak_task=task, leak_split=split,
                    leak_text=copy,
                )  # fmt: skip
            else:
                rows.add(**row, bucket=ordinal % buckets, words=words, reason=reason)
        if len(rows) >= BLOCK_ROWS:
            yield rows.table()
    errors()
    if len(rows):
        yield rows.table()


def error_columns(err: DataError) -> dict[str, Any]:
    return {"error_file": err.path, "error_line": err.line, "error_rule": err.rule, "error_detail": err.detail}


def row_error(row: dict[str, Any]) -> DataError:
    """The :class:`DataError` :func:`error_columns` put into a row."""
    return DataError(row["error_file"], row["error_line"], row["error_rule"], row["error_detail"])


# ----------------------------------------------------------------------------- 2. exact dedup (a group-by)


def mark_duplicates(group: pa.Table) -> pa.Table:
    """In one hash bucket: the first copy of each text (read order) stays, or is ``leakage``; the rest ``duplicate``."""
    candidate = pc.and_(group["is_doc"], pc.is_null(group["reason"])).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(candidate)
    if not len(rows):
        return group
    hashes = group["hash"].to_numpy(zero_copy_only=False)[rows]
    ordinals = group["ordinal"].to_numpy()[rows]
    order = rows[np.lexsort((ordinals, hashes))]
    sorted_hashes = group["hash"].to_numpy(zero_copy_only=False)[order]
    first = np.concatenate(([True], sorted_hashes[1:] != sorted_hashes[:-1]))
    leaked = pc.is_valid(group["leak_task"]).to_numpy(zero_copy_only=False)
    duplicate = np.zeros(len(group), dtype=bool)
    duplicate[order[~first]] = True
    leakage = np.zeros(len(group), dtype=bool)
    leakage[order[first]] = leaked[order[first]]
    reason = pc.if_else(pa.array(duplicate), "duplicate", pc.if_else(pa.array(leakage), "leakage", group["reason"]))
    text = pc.if_else(pa.array(duplicate | leakage), pa.scalar(None, pa.string()), group["text"])  # no longer needed
    group = group.set_column(ROWS.get_field_index("reason"), "reason", reason)
    return group.set_column(ROWS.get_field_index("text"), "text", text)


# ----------------------------------------------------------------------------- 3. near checks (per batch)


def near_columns(batch: pa.Table, cfg: IngestConfig, evaluation: list[tuple[str, str, str]]) -> pa.Table:
    """Contamination columns of every document still in, and their signatures and band keys (``sig``/``keys``)."""
    near = cached_near(cfg, evaluation)
    live = np.flatnonzero(pc.is_null(batch["reason"]).to_numpy(zero_copy_only=False) & batch["is_doc"].to_numpy())
    texts = batch["text"].take(pa.array(live, pa.int64())).to_pylist()
    words = words_of(texts)
    hits = near.evaluation.contaminated(texts, words) if near.evaluation else [None] * len(texts)
    columns = {c: batch[c].to_pylist() for c in ("hit_task", "hit_split", "hit_evaluation", "hit_sentence")}
    jaccard = batch["hit_jaccard"].to_pylist()
    for i, hit in zip(live.tolist(), hits, strict=True):
        if hit is not None:
            columns["hit_task"][i], columns["hit_split"][i] = hit.task, hit.split
            columns["hit_evaluation"][i], columns["hit_sentence"][i], jaccard[i] = (
                hit.evaluation_text,
                hit.corpus_sentence,
                hit.jaccard,
            )
    for name, values in columns.items():
        batch = batch.set_column(ROWS.get_field_index(name), name, pa.array(values, pa.string()))
    batch = batch.set_column(ROWS.get_field_index("hit_jaccard"), "hit_jaccard", pa.array(jaccard, pa.float64()))
    sig_column: list[bytes | None] = [None] * len(batch)
    key_column: list[bytes | None] = [None] * len(batch)
    if near.duplicates is not None and len(live):
        sigs, keys = near.duplicates.sketch(words)
        for i, sig, key in zip(live.tolist(), sigs, keys, strict=True):
            sig_column[i], key_column[i] = sig.tobytes(), key.tobytes()
    return batch.append_column("sig", pa.array(sig_column, pa.binary())).append_column(
        "keys", pa.array(key_column, pa.binary())
    )


_NEAR: dict[int, NearChecks] = {}


def cached_near(cfg: IngestConfig, evaluation: list[tuple[str, str, str]]) -> NearChecks:
    key = hash((cfg.model_dump_json(), tuple(evaluation)))
    if key not in _NEAR:
        _NEAR.clear()
        _NEAR[key] = NearChecks(cfg, evaluation)
    return _NEAR[key]


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
    keys = group["key"].to_numpy()
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    shared = counts[inverse] > 1
    return pa.table({"ordinal": np.unique(group["ordinal"].to_numpy()[shared])})


def sketches_of(batch: pa.Table, wanted: np.ndarray) -> pa.Table:
    """The ``ordinal, hash, sig, keys`` rows of the documents in ``wanted`` (a sorted ordinal array)."""
    ordinals = batch["ordinal"].to_numpy()
    at = np.searchsorted(wanted, ordinals)
    hit = (at < len(wanted)) & (wanted[np.minimum(at, len(wanted) - 1)] == ordinals) if len(wanted) else at < 0
    return batch.filter(pa.array(hit)).select(SKETCHES.names)


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


# ----------------------------------------------------------------------------- 6. write (replay in read order)


def replay(builder: CorpusBuilder, batch: pa.Table, dups: dict[int, tuple[str, float]], policy: ErrorPolicy) -> None:
    """Every row of ``batch`` (in read order) through ``builder`` as the local engine meets it."""
    for row in batch.to_pylist():
        source = row["source"]
        if not row["is_doc"]:
            policy.handle(row_error(row))
            continue
        builder.count_read(source)
        reason = row["reason"]
        if reason == "bad_record":
            policy.handle(row_error(row))
        if reason == "leakage":
            copy = row["leak_text"]
            hit = Contamination(row["leak_task"], row["leak_split"], copy, copy, 1.0)
            builder.near.record(builder.stats, hit, source, row["line"])
        if reason is not None:
            builder.stats.dropped[reason] += 1
            continue
        found = (
            Contamination(
                row["hit_task"], row["hit_split"], row["hit_evaluation"], row["hit_sentence"], row["hit_jaccard"]
            )
            if row["hit_task"] is not None
            else None
        )
        known = (found, dups.get(row["ordinal"]))
        builder.queue(Pending(row["hash"], row["text"], source, row["line"], row["words"], known=known))


# ----------------------------------------------------------------------------- the whole


def plan_shards(cfg: IngestConfig, root: Path) -> list[Shard]:
    """Every file of every source, in the local engine's read order (opened by absolute path: a worker runs
    elsewhere; named as the local engine names it)."""
    shards: list[Shard] = []
    for s, source in enumerate(cfg.corpus.sources):
        for name, path in shards_of(source, root):
            shards.append(Shard(len(shards), s, name, path.absolute() if path is not None else None))
    return shards


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
