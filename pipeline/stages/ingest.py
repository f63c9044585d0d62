"""ingest stage: sources -> normalised, deduplicated, split corpus + normalised task splits.

Streaming throughout: corpus documents are read one at a time and written to Parquet in
chunks of ``ingest.chunk_docs``, so memory holds one chunk plus one 64-bit hash per unique
document (for exact dedup), whatever the corpus size. Task data (labelled, small) is read
whole per split. Outputs replace the previous ones only when the whole stage succeeded.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.config import Config
from pipeline.core.console import Progress
from pipeline.core.errors import DataError
from pipeline.core.io import transaction, write_json
from pipeline.core.paths import Paths
from pipeline.core.sections.base import SPLITS
from pipeline.core.sections.ingest import CorpusConfig, FileSource, IngestConfig, TaskConfig
from pipeline.tasks.base import Record
from pipeline.tasks.registry import kind_of
from pipeline.text.readers import ErrorPolicy, iter_hf_texts, iter_records, required_field, resolve_paths
from pipeline.text.textnorm import normalize_text, split_of_hash, text_hash

CORPUS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),  # 16 hex digits of the normalised text's 64-bit hash
        ("text", pa.string()),
        ("source", pa.string()),  # file (or hf:id[split]) the document came from
        ("line", pa.int64()),  # 1-based line / row / paragraph start in that source
        ("chars", pa.int32()),
        ("words", pa.int32()),
    ]
)


# ----------------------------------------------------------------------------- tasks


def normalize_task_record(task: TaskConfig, rec: dict[str, Any], path: Path, line: int, form: str) -> dict[str, Any]:
    """One task record in the normalised schema of its task type."""
    return kind_of(task.type).normalize(Record(rec, task.field, path, line, form))


def read_task_split(
    task: TaskConfig, split: str, cfg: IngestConfig, policy: ErrorPolicy, root: Path
) -> list[dict[str, Any]]:
    """All normalised records of one split, each with ``id``, ``source_file`` and ``source_line``."""
    rows: list[dict[str, Any]] = []
    kind = kind_of(task.type)
    fields = list(dict.fromkeys(task.field(k) for k in kind.fields if k not in kind.optional_fields))
    for path in resolve_paths(task.files[split], root):
        for line, rec in iter_records(
            path, task.format, policy, cfg.max_record_bytes, fields, csv_multiline=cfg.csv_multiline
        ):
            try:
                row = normalize_task_record(task, rec, path, line, cfg.unicode_form)
            except DataError as err:
                policy.handle(err)
                continue
            rows.append({"id": f"{split}-{len(rows):07d}", "source_file": str(path), "source_line": line, **row})
    return rows


def label_list(task: TaskConfig, train: list[dict[str, Any]]) -> tuple[list[str], str]:
    """The task's labels: from params if given, else frozen from the train split (none for unlabelled types)."""
    if task.labels is not None:
        return list(task.labels), "params"
    kind = kind_of(task.type)
    return (kind.label_list(train), "train") if kind.labelled else ([], "none")


def ingest_tasks(cfg: IngestConfig, out_dir: Path, policy: ErrorPolicy, root: Path) -> tuple[dict[str, Any], list[str]]:
    """Write every task's normalised splits and ``task.json``; return stats and leak texts."""
    stats: dict[str, Any] = {}
    leak: list[str] = []
    for task in cfg.tasks:
        task_dir = out_dir / task.name
        task_dir.mkdir(parents=True)
        splits = {}
        for split in SPLITS:
            before = sum(policy.counts.values())
            splits[split] = read_task_split(task, split, cfg, policy, root)
            stats_split = {"examples": len(splits[split]), "skipped": sum(policy.counts.values()) - before}
            stats.setdefault(task.name, {"type": task.type, "splits": {}})["splits"][split] = stats_split
            pq.write_table(
                pa.Table.from_pylist(splits[split]) if splits[split] else pa.table({"id": pa.array([], pa.string())}),
                task_dir / f"{split}.parquet",
            )
        labels, labels_from = label_list(task, splits["train"])
        meta = {
            "name": task.name,
            "type": task.type,
            "labels": labels,
            "labels_from": labels_from,
            "files": dict(task.files),
            "examples": {s: len(splits[s]) for s in SPLITS},
        }
        write_json(task_dir / "task.json", meta)
        stats[task.name].update(labels=len(labels), labels_from=labels_from)
        for split in ("validation", "test"):
            leak.extend(t for row in splits[split] for t in kind_of(task.type).leakage_texts(row))
    return stats, leak


# ----------------------------------------------------------------------------- corpus


def leak_key(text: str) -> str:
    """Case- and spacing-insensitive form used to find task text inside corpus documents."""
    return "".join(text.casefold().split())


class LeakageGuard:
    """Finds corpus documents that contain any evaluation text (Aho-Corasick, linear time)."""

    def __init__(self, texts: list[str], min_chars: int) -> None:
        import ahocorasick

        self.automaton = ahocorasick.Automaton()
        for text in texts:
            key = leak_key(text)
            if len(key) >= min_chars:
                self.automaton.add_word(key, len(key))
        self.size = len(self.automaton)
        if self.size:
            self.automaton.make_automaton()

    def leaks(self, text: str) -> bool:
        return bool(self.size) and next(self.automaton.iter(leak_key(text)), None) is not None


def iter_source_texts(
    cfg: IngestConfig, policy: ErrorPolicy, root: Path, sources: dict[str, Counter[str]]
) -> Iterator[tuple[str, int, Any]]:
    """``(source, line, raw_text)`` for every record of every configured corpus source.

    Every file (and hub dataset) gets an entry in ``sources`` before it is read, so one that
    contributes nothing is still counted, with zero.
    """
    for source in cfg.corpus.sources:
        if isinstance(source, FileSource):
            for path in resolve_paths(source.path, root):
                sources.setdefault(str(path), Counter())
                for line, rec in iter_records(
                    path,
                    source.format,
                    policy,
                    cfg.max_record_bytes,
                    [source.text_field],
                    source.txt_mode,
                    cfg.csv_multiline,
                ):
                    try:
                        text = required_field(
                            rec, source.text_field, path, line
                        )  # missing or null: the task records' rules
                    except DataError as err:
                        policy.handle(err)
                        continue
                    yield str(path), line, text
        else:
            where = f"hf:{source.name}[{source.split}]"
            sources.setdefault(where, Counter())
            for line, text in iter_hf_texts(
                source.name, source.config_name, source.split, source.text_field, source.max_docs
            ):
                yield where, line, text


@dataclass
class CorpusStats:
    read: int = 0
    kept: Counter[str] = field(default_factory=Counter)  # split -> documents
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> documents
    characters: int = 0
    words: int = 0
    sources: dict[str, Counter[str]] = field(default_factory=dict)  # source -> {"read": n, "kept": n}


def drop_reason(text: str, words: int, c: CorpusConfig) -> str | None:
    """Why a normalised document fails the length filters, or ``None`` when it passes."""
    if not text:
        return "empty"
    if len(text) < c.min_chars:
        return "too_short_chars"
    if len(text) > c.max_chars:
        return "too_long_chars"
    if words < c.min_words:
        return "too_short_words"
    if words > c.max_words:
        return "too_long_words"
    return None


class ChunkedParquet:
    """Appends rows to a Parquet file, one row group per ``chunk`` rows."""

    def __init__(self, path: Path, chunk: int) -> None:
        self.writer = pq.ParquetWriter(path, CORPUS_SCHEMA)
        self.chunk = chunk
        self.rows: list[tuple[Any, ...]] = []

    def add(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            ids, texts, sources, lines, words = zip(*self.rows, strict=True)
            text = pa.array(texts, pa.string())
            chars = pc.utf8_length(text).cast(pa.int32())  # computed in Arrow, not per row in Python
            columns = [
                pa.array(ids, pa.string()),
                text,
                pa.array(sources, pa.string()),
                pa.array(lines, pa.int64()),
                chars,
                pa.array(words, pa.int32()),
            ]
            self.writer.write_table(pa.Table.from_arrays(columns, schema=CORPUS_SCHEMA))
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


def ingest_corpus(
    cfg: IngestConfig, out_dir: Path, guard: LeakageGuard, policy: ErrorPolicy, root: Path
) -> CorpusStats:
    """Stream every source through normalise -> filter -> dedup -> leakage -> split -> Parquet."""
    c = cfg.corpus
    stats = CorpusStats()
    seen: set[int] = set()
    writers = {split: ChunkedParquet(out_dir / f"{split}.parquet", cfg.chunk_docs) for split in ("train", "validation")}
    progress = Progress("ingest: corpus", None, "documents")  # a line every 10 s on a large corpus
    try:
        for source, line, raw in iter_source_texts(cfg, policy, root, stats.sources):
            stats.read += 1
            if stats.read % 1000 == 0:
                progress.update(stats.read, kept=stats.kept["train"] + stats.kept["validation"])
            stats.sources[source]["read"] += 1
            if not isinstance(raw, str):
                policy.handle(
                    DataError(source, line, "wrong-type", f"text field must be a string, got {type(raw).__name__}")
                )
                stats.dropped["bad_record"] += 1
                continue
            text = normalize_text(raw, cfg.unicode_form)
            words = text.count(" ") + 1 if text else 0  # whitespace is collapsed: spaces + 1
            reason = drop_reason(text, words, c)
            if reason is None:
                h = text_hash(text)
                if h in seen:
                    reason = "duplicate"
                else:
                    seen.add(h)
                    if guard.leaks(text):
                        reason = "leakage"
            if reason:
                stats.dropped[reason] += 1
                continue
            split = split_of_hash(h, c.validation_fraction)
            writers[split].add((f"{h:016x}", text, source, line, words))
            stats.kept[split] += 1
            stats.sources[source]["kept"] += 1
            stats.characters += len(text)
            stats.words += words
    finally:
        for w in writers.values():
            w.close()
        progress.close()
    return stats


# ----------------------------------------------------------------------------- stage


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Ingest tasks and corpus per ``cfg.ingest``; write outputs and ``reports/ingest.json``.

    Raises :class:`DataError` on bad input under ``on_error: fail``, or when nothing usable is
    left; the previous outputs then stay untouched.
    """
    ic = cfg.ingest
    start = time.perf_counter()
    task_policy = ErrorPolicy(ic.on_error)
    corpus_policy = ErrorPolicy(ic.on_error)
    with transaction(paths.root, "ingest") as txn:
        tasks_tmp, corpus_tmp = txn.dir(paths.tasks), txn.dir(paths.corpus)
        task_stats, leak = ingest_tasks(ic, tasks_tmp, task_policy, paths.root)
        guard = LeakageGuard(leak, ic.leakage_min_chars)
        stats = ingest_corpus(ic, corpus_tmp, guard, corpus_policy, paths.root)
        if stats.kept["train"] == 0:
            raise DataError(
                "ingest.corpus.sources",
                None,
                "no-documents",
                f"no document left for training after filters ({stats.read} read, "
                f"dropped {dict(stats.dropped)}, errors {dict(corpus_policy.counts)})",
            )
        seconds = time.perf_counter() - start
        report = {
            "corpus": {
                "documents_read": stats.read,
                "documents_kept": sum(stats.kept.values()),
                "train_documents": stats.kept["train"],
                "validation_documents": stats.kept["validation"],
                "dropped": dict(sorted(stats.dropped.items())),
                "errors_skipped": dict(sorted(corpus_policy.counts.items())),
                "error_examples": corpus_policy.examples,
                "duplicate_ratio": round(stats.dropped["duplicate"] / stats.read, 6) if stats.read else 0.0,
                "characters": stats.characters,
                "words": stats.words,
                "sources": {s: {"read": c["read"], "kept": c["kept"]} for s, c in stats.sources.items()},
                "empty_sources": [s for s, c in stats.sources.items() if c["kept"] == 0],
            },
            "tasks": task_stats,
            "task_errors_skipped": dict(sorted(task_policy.counts.items())),
            "task_error_examples": task_policy.examples,
            "leakage": {"evaluation_texts_indexed": guard.size, "documents_dropped": stats.dropped["leakage"]},
            "seconds": round(seconds, 2),
        }
        txn.write_report(paths.ingest_report, report)
    return report


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline ingest`` (what ``run`` returned, read for a person)."""
    c = r["corpus"]
    dropped = ", ".join(f"{k} {v}" for k, v in c["dropped"].items()) or "none"
    skipped = ", ".join(f"{k} {v}" for k, v in c["errors_skipped"].items())
    tasks = "; ".join(
        f"{name} {'/'.join(str(s['examples']) for s in t['splits'].values())}" for name, t in r["tasks"].items()
    )
    task_skips = ", ".join(f"{k} {v}" for k, v in r["task_errors_skipped"].items())
    empty = c["empty_sources"]
    warning = (
        f"\nwarning: {len(empty)} source(s) contributed no document: {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}"
        if empty
        else ""
    )
    return (
        f"{c['documents_read']} documents read from {len(c['sources'])} source(s) -> {c['train_documents']} train + "
        f"{c['validation_documents']} validation (dropped: {dropped}{'; bad records skipped: ' + skipped if skipped else ''})\n"
        f"tasks (train/validation/test): {tasks or 'none'}{'; bad task records skipped: ' + task_skips if task_skips else ''}"
        f"{warning}\n{r['seconds']} s; report: {paths.ingest_report}"
    )
