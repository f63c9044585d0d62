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
from pipeline.text.neardup import Contamination, EvaluationIndex, NearDuplicateIndex, words_of
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


def ingest_tasks(
    cfg: IngestConfig, out_dir: Path, policy: ErrorPolicy, root: Path
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Write every task's normalised splits and ``task.json``; return stats and the evaluation
    texts ``(task, split, text)`` that must not appear in the corpus."""
    stats: dict[str, Any] = {}
    leak: list[tuple[str, str, str]] = []
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
            leak.extend((task.name, split, t) for row in splits[split] for t in kind_of(task.type).leakage_texts(row))
    return stats, leak


# ----------------------------------------------------------------------------- corpus


def leak_key(text: str) -> str:
    """Case- and spacing-insensitive form used to find task text inside corpus documents."""
    return "".join(text.casefold().split())


class LeakageGuard:
    """Finds corpus documents that contain any evaluation text (Aho-Corasick, linear time)."""

    def __init__(self, texts: list[str] | list[tuple[str, str, str]], min_chars: int) -> None:
        """``texts``: evaluation texts, or ``(task, split, text)`` to know which one a document holds."""
        import ahocorasick

        self.automaton = ahocorasick.Automaton()
        for item in texts:
            origin = item if isinstance(item, tuple) else ("", "", item)
            key = leak_key(origin[2])
            if len(key) >= min_chars:
                self.automaton.add_word(key, origin)
        self.size = len(self.automaton)
        if self.size:
            self.automaton.make_automaton()

    def leaks(self, text: str) -> bool:
        return self.match(text) is not None

    def match(self, text: str) -> tuple[str, str, str] | None:
        """The first ``(task, split, text)`` whose text ``text`` contains, or ``None``."""
        if not self.size:
            return None
        hit = next(self.automaton.iter(leak_key(text)), None)
        return None if hit is None else hit[1]


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
    contaminated_by_task: Counter[str] = field(default_factory=Counter)
    contaminated_by_source: Counter[str] = field(default_factory=Counter)
    contamination_examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # task -> examples
    near_duplicate_examples: list[dict[str, Any]] = field(default_factory=list)


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


@dataclass
class Pending:
    """A document that passed the filters, exact dedup and the exact leakage guard, waiting for the
    batched near-duplicate and contamination checks."""

    h: int
    text: str
    source: str
    line: int
    words: int


class NearChecks:
    """The batched MinHash checks of :mod:`pipeline.text.neardup` (either may be off)."""

    def __init__(self, cfg: IngestConfig, evaluation: list[tuple[str, str, str]]) -> None:
        m, nd, dc = cfg.minhash, cfg.near_duplicates, cfg.decontamination
        self.duplicates = NearDuplicateIndex(nd.threshold, nd.shingle_words, m.num_perm, m.seed) if nd.enabled else None
        self.evaluation = (
            EvaluationIndex(evaluation, dc.threshold, dc.shingle_words, m.num_perm, m.seed, cfg.leakage_min_chars)
            if dc.enabled
            else None
        )
        self.examples = dc.examples
        self.seconds = 0.0

    @property
    def active(self) -> bool:
        return self.duplicates is not None or self.evaluation is not None

    def record(self, stats: CorpusStats, hit: Contamination, source: str, line: int) -> None:
        """Count a document dropped for holding (a near-copy of) an evaluation text, by task and source."""
        stats.contaminated_by_task[hit.task] += 1
        stats.contaminated_by_source[source] += 1
        shown = stats.contamination_examples.setdefault(hit.task, [])
        if len(shown) < self.examples:
            shown.append(
                {
                    "source": source,
                    "line": line,
                    "split": hit.split,
                    "evaluation_sentence": hit.evaluation_text,
                    "corpus_sentence": hit.corpus_sentence,
                    "jaccard": hit.jaccard,  # 1.0: an exact copy (case and spacing aside), found by the leakage guard
                }
            )

    def reasons(self, batch: list[Pending], stats: CorpusStats) -> list[str | None]:
        """Per document: ``"contaminated"``, ``"near_duplicate"`` or ``None`` (kept); examples go to ``stats``."""
        start = time.perf_counter()
        texts = [p.text for p in batch]
        words = words_of(texts)
        found: list[Contamination | None] = (
            self.evaluation.contaminated(texts, words) if self.evaluation else [None] * len(batch)
        )
        # contaminated documents join the index too, so that their near-copies also go
        dups = (
            self.duplicates.check_batch(words, [f"{p.h:016x}" for p in batch])
            if self.duplicates
            else [None] * len(batch)
        )
        out: list[str | None] = []
        for doc, hit, dup in zip(batch, found, dups, strict=True):
            if hit is not None:
                self.record(stats, hit, doc.source, doc.line)
                out.append("contaminated")
            elif dup is not None:
                if len(stats.near_duplicate_examples) < self.examples:
                    stats.near_duplicate_examples.append(
                        {"source": doc.source, "line": doc.line, "near_copy_of": dup[0], "jaccard": dup[1]}
                    )
                out.append("near_duplicate")
            else:
                out.append(None)
        self.seconds += time.perf_counter() - start
        return out


def ingest_corpus(  # noqa: C901, PLR0915  # to split (issue 29, part 5)
    cfg: IngestConfig, out_dir: Path, guard: LeakageGuard, near: NearChecks, policy: ErrorPolicy, root: Path
) -> CorpusStats:
    """Stream every source through normalise -> filter -> dedup -> leakage -> near-duplicates and
    contamination (in batches of ``chunk_docs``) -> split -> Parquet."""
    c = cfg.corpus
    stats = CorpusStats()
    seen: set[int] = set()
    writers = {split: ChunkedParquet(out_dir / f"{split}.parquet", cfg.chunk_docs) for split in ("train", "validation")}
    progress = Progress("ingest: corpus", None, "documents")  # a line every 10 s on a large corpus
    pending: list[Pending] = []

    def keep(doc: Pending) -> None:
        split = split_of_hash(doc.h, c.validation_fraction)
        writers[split].add((f"{doc.h:016x}", doc.text, doc.source, doc.line, doc.words))
        stats.kept[split] += 1
        stats.sources[doc.source]["kept"] += 1
        stats.characters += len(doc.text)
        stats.words += doc.words

    def flush() -> None:
        for doc, reason in zip(pending, near.reasons(pending, stats), strict=True):
            if reason:
                stats.dropped[reason] += 1
            else:
                keep(doc)
        pending.clear()

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
                    leak = guard.match(text)
                    if leak is not None:
                        reason = "leakage"
                        near.record(stats, Contamination(leak[0], leak[1], leak[2], leak[2], 1.0), source, line)
            if reason:
                stats.dropped[reason] += 1
                continue
            doc = Pending(h, text, source, line, words)
            if not near.active:
                keep(doc)
                continue
            pending.append(doc)
            if len(pending) >= cfg.chunk_docs:
                flush()
        if pending:
            flush()
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
        near = NearChecks(ic, leak)
        stats = ingest_corpus(ic, corpus_tmp, guard, near, corpus_policy, paths.root)
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
            "near_duplicates": near_duplicate_report(ic, stats),
            "decontamination": decontamination_report(ic, near, stats),
            "seconds": round(seconds, 2),
            "near_checks_seconds": round(near.seconds, 2),  # of them, the batched MinHash checks
        }
        txn.write_report(paths.ingest_report, report)
    return report


def near_duplicate_report(ic: IngestConfig, stats: CorpusStats) -> dict[str, Any]:
    """reports/ingest.json ``near_duplicates``: the settings, the documents dropped, a few examples."""
    nd = ic.near_duplicates
    return {
        "enabled": nd.enabled,
        "threshold": nd.threshold,
        "shingle_words": nd.shingle_words,
        "documents_dropped": stats.dropped["near_duplicate"],
        "examples": stats.near_duplicate_examples,
    }


def decontamination_report(ic: IngestConfig, near: NearChecks, stats: CorpusStats) -> dict[str, Any]:
    """reports/ingest.json ``decontamination``: documents dropped for holding a copy (reason leakage) or a
    near-copy (reason contaminated) of an evaluation text, per task and per source, with examples."""
    dc = ic.decontamination
    return {
        "enabled": dc.enabled,
        "threshold": dc.threshold,
        "shingle_words": dc.shingle_words,
        "evaluation_sentences_indexed": near.evaluation.size if near.evaluation else 0,
        "documents_dropped": stats.dropped["contaminated"] + stats.dropped["leakage"],
        "exact_copies": stats.dropped["leakage"],
        "near_copies": stats.dropped["contaminated"],
        "by_task": {t.name: stats.contaminated_by_task[t.name] for t in ic.tasks},
        "by_source": {s: stats.contaminated_by_source[s] for s in stats.sources},
        "examples": stats.contamination_examples,
    }


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
        f"{warning}{near_summary(r)}\n{r['seconds']} s; report: {paths.ingest_report}"
    )


def near_summary(r: dict[str, Any]) -> str:
    """Console lines on decontamination and near-duplicates (empty where both are off)."""
    lines = []
    dc, nd = r.get("decontamination", {}), r.get("near_duplicates", {})
    if dc.get("enabled"):
        per_task = ", ".join(f"{t} {n}" for t, n in dc["by_task"].items()) or "no tasks"
        lines.append(
            f"decontamination: {dc['documents_dropped']} document(s) held a copy ({dc['exact_copies']}) or near-copy "
            f"({dc['near_copies']}) of a validation/test text ({per_task}; Jaccard >= {dc['threshold']} over {dc['shingle_words']}-word shingles, "
            f"{dc['evaluation_sentences_indexed']} sentences indexed)"
        )
        for task, examples in dc["examples"].items():
            if examples:
                e = examples[0]
                lines.append(
                    f"  e.g. {task} {e['split']}: {shorten(e['evaluation_sentence'])!r} ~ {e['source']}:{e['line']} "
                    f"{shorten(e['corpus_sentence'])!r} (Jaccard {e['jaccard']})"
                )
    if nd.get("enabled"):
        lines.append(
            f"near-duplicates: {nd['documents_dropped']} document(s) (Jaccard >= {nd['threshold']} over "
            f"{nd['shingle_words']}-word shingles with an earlier kept one)"
        )
    return "".join(f"\n{line}" for line in lines)


def shorten(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (console examples)."""
    return text if len(text) <= width else text[: width - 1] + "…"
