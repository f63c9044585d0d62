"""The corpus as rows in read order: the per-document half of ingest that the Ray engine and the local engine's
on-disk index share (:mod:`pipeline.text.corpus_ray`, :mod:`pipeline.text.corpus_disk`).

Every record of every source file becomes a row of :data:`ROWS` numbered in read order (``ordinal``: file index x
2**40 + position), screened on its own by :mod:`pipeline.text.corpus`'s functions (filters, hash, leakage match);
:func:`check_rows` adds contamination and the MinHash sketch per batch; once the engine has decided the exact and
near duplicates, :func:`replay` feeds every row, in read order, through the local engine's
:class:`~pipeline.text.corpus.CorpusBuilder`: the same counts, examples, row groups and files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.errors import DataError
from pipeline.text.corpus import (
    CorpusBuilder,
    LeakageGuard,
    NearChecks,
    Pending,
    iter_shard_texts,
    screen,
    source_files,
    wrong_type,
)
from pipeline.text.neardup import Contamination, words_of
from pipeline.text.readers import ErrorPolicy
from pipeline.text.textnorm import text_hash

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import IngestConfig

SHARD_BITS = 40  # ordinal = file index << 40 | record position: 2**40 records per file, 2**23 files

ROWS = pa.schema(
    [
        ("ordinal", pa.int64()),  # read order: file index << SHARD_BITS | position in the file
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
        ("hit_containment", pa.float64()),
    ]
)


@dataclass(frozen=True)
class Shard:
    """One file (or hub dataset) of a corpus source: the unit of read parallelism."""

    index: int
    source: int  # its source's position in ingest.corpus.sources
    name: str  # as the local engine names it (relative to where the stage runs, if the params path is)
    path: Path | None  # absolute
    group: int  # its file group: the output shards its documents go to (pipeline.text.corpus_shards)


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


def screen_shard(shard: Shard, cfg: IngestConfig, evaluation: list[tuple[str, str, str]]) -> Iterator[pa.Table]:
    """Every record of one file as a row: screened on its own (filters, hash, leakage match); a table per
    ``ingest.chunk_docs`` rows (the streamed engine's batch: the same memory)."""
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
            rows.add(**row, reason="bad_record", **error_columns(bad))
        else:
            text, words, reason = screen(raw, cfg)
            if reason is None:
                h = text_hash(text)
                leak = guard.match(text)
                task, split, copy = leak if leak is not None else (None, None, None)
                rows.add(
                    **row, text=text, words=words, hash=h, leak_task=task, leak_split=split,
                    leak_text=copy,
                )  # fmt: skip
            else:
                rows.add(**row, words=words, reason=reason)
        if len(rows) >= cfg.chunk_docs:
            yield rows.table()
    errors()
    if len(rows):
        yield rows.table()


def error_columns(err: DataError) -> dict[str, Any]:
    return {"error_file": err.path, "error_line": err.line, "error_rule": err.rule, "error_detail": err.detail}


def row_error(row: dict[str, Any]) -> DataError:
    """The :class:`DataError` :func:`error_columns` put into a row."""
    return DataError(row["error_file"], row["error_line"], row["error_rule"], row["error_detail"])


# ----------------------------------------------------------------------------- 3. near checks (per batch)


def check_rows(
    batch: pa.Table, live: np.ndarray, near: NearChecks
) -> tuple[pa.Table, tuple[np.ndarray, np.ndarray] | None]:
    """``batch`` with the contamination columns of its rows ``live`` filled in, and those rows' MinHash signatures
    and band keys (``None`` when near-duplicate detection is off)."""
    texts = batch["text"].take(pa.array(live, pa.int64())).to_pylist()
    words = words_of(texts)
    hits = near.evaluation.contaminated(texts, words) if near.evaluation else [None] * len(texts)
    columns = {c: batch[c].to_pylist() for c in ("hit_task", "hit_split", "hit_evaluation", "hit_sentence")}
    containment = batch["hit_containment"].to_pylist()
    for i, hit in zip(live.tolist(), hits, strict=True):
        if hit is not None:
            columns["hit_task"][i], columns["hit_split"][i] = hit.task, hit.split
            columns["hit_evaluation"][i], columns["hit_sentence"][i], containment[i] = (
                hit.evaluation_text,
                hit.corpus_sentence,
                hit.containment,
            )
    for name, values in columns.items():
        batch = batch.set_column(ROWS.get_field_index(name), name, pa.array(values, pa.string()))
    batch = batch.set_column(
        ROWS.get_field_index("hit_containment"), "hit_containment", pa.array(containment, pa.float64())
    )
    if near.duplicates is None or not len(live):
        return batch, None
    return batch, near.duplicates.sketch(words)


def hash_column(batch: pa.Table) -> np.ndarray:
    """The ``hash`` column as uint64 (0 where null: a row without a document); ``to_numpy`` on a column with nulls
    would give float64, whose 53-bit mantissa merges distinct hashes."""
    return pc.fill_null(batch["hash"], 0).to_numpy()


def later_copies(hashes: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
    """Positions of the pairs whose hash an earlier ordinal (read order) has too: the exact duplicates."""
    order = np.lexsort((ordinals, hashes))
    sorted_hashes = hashes[order]
    first = np.concatenate(([True], sorted_hashes[1:] != sorted_hashes[:-1]))
    return order[~first]


def in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``sorted_set`` (a sorted array): a mask, one binary search each."""
    if not len(sorted_set):
        return np.zeros(len(values), dtype=bool)
    return sorted_set[np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)] == values


def sharing_a_key(keys: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
    """The distinct ordinals (sorted) of the pairs whose key another pair has too: the documents that collide."""
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return np.unique(ordinals[counts[inverse] > 1])


def mark_exact(batch: pa.Table, duplicate: np.ndarray) -> pa.Table:
    """``batch`` with the rows ``duplicate`` (a mask) dropped as ``duplicate``, and the other documents still in that
    hold an evaluation text as ``leakage`` (the first copy of a text is the one that is not a duplicate); their text
    is no longer needed and is released."""
    candidate = pc.and_(batch["is_doc"], pc.is_null(batch["reason"])).to_numpy(zero_copy_only=False)
    leakage = candidate & ~duplicate & pc.is_valid(batch["leak_task"]).to_numpy(zero_copy_only=False)
    reason = pc.if_else(pa.array(duplicate), "duplicate", pc.if_else(pa.array(leakage), "leakage", batch["reason"]))
    text = pc.if_else(pa.array(duplicate | leakage), pa.scalar(None, pa.string()), batch["text"])
    batch = batch.set_column(ROWS.get_field_index("reason"), "reason", reason)
    return batch.set_column(ROWS.get_field_index("text"), "text", text)


_NEAR: dict[int, NearChecks] = {}


def cached_near(cfg: IngestConfig, evaluation: list[tuple[str, str, str]]) -> NearChecks:
    key = hash((cfg.model_dump_json(), tuple(evaluation)))
    if key not in _NEAR:
        _NEAR.clear()
        _NEAR[key] = NearChecks(cfg, evaluation)
    return _NEAR[key]


# ----------------------------------------------------------------------------- 6. write (replay in read order)


def replay(
    builder: CorpusBuilder, batch: pa.Table, group: int, dups: dict[int, tuple[str, float]], policy: ErrorPolicy
) -> None:
    """Every row of ``batch`` (in read order, of a file of group ``group``) through ``builder`` as the local engine
    meets it."""
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
                row["hit_task"], row["hit_split"], row["hit_evaluation"], row["hit_sentence"], row["hit_containment"]
            )
            if row["hit_task"] is not None
            else None
        )
        known = (found, dups.get(row["ordinal"]))
        builder.queue(Pending(row["hash"], row["text"], source, group, row["line"], row["words"], known=known))


def plan_shards(cfg: IngestConfig, root: Path) -> list[Shard]:
    """Every file of every source, in the local engine's read order (opened by absolute path: a worker runs
    elsewhere; named as the local engine names it), with its file group."""
    return [
        Shard(index, s, name, path.absolute() if path is not None else None, group)
        for index, (s, name, path, group) in enumerate(source_files(cfg, root))
    ]
