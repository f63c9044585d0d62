"""The domain corpus, streamed: sources -> normalise -> filter -> exact dedup -> leakage guard ->
near-duplicates and contamination (MinHash, in batches) -> hash split -> Parquet (the ingest stage's corpus half).

Memory holds one chunk of ``ingest.chunk_docs`` documents plus, per kept document, its 64-bit hash (exact
dedup) and, with near-duplicates on, its signature and band keys (~0.75 KB, :class:`NearDuplicateIndex`).
:mod:`pipeline.text.corpus_disk` keeps those indexes on disk instead (``ingest.index: disk``: bounded memory), and
:mod:`pipeline.text.corpus_ray` runs the same work on a Ray cluster (``ingest.engine: ray``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.console import Progress
from pipeline.core.errors import DataError
from pipeline.core.io import file_digest
from pipeline.text.corpus_shards import MB, SPLITS, CorpusShard, file_groups, shard_file
from pipeline.text.neardup import Contamination, EvaluationIndex, NearDuplicateIndex, words_of
from pipeline.text.readers import ErrorPolicy, iter_hf_texts, iter_records, required_field, resolve_paths
from pipeline.text.textnorm import normalize_text, split_of_hash, text_hash

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import CorpusConfig, CorpusSource, IngestConfig

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


def shards_of(source: CorpusSource, root: Path) -> list[tuple[str, Path | None]]:
    """``(name, path)`` of each file a corpus source reads, in order (a hub dataset: one, without a path)."""
    if source.type == "files":  # a FileSource (else an HFSource)
        return [(str(path), path) for path in resolve_paths(source.path, root)]
    return [(f"hf:{source.name}[{source.split}]", None)]


def iter_shard_texts(
    cfg: IngestConfig, source: CorpusSource, name: str, path: Path | None, policy: ErrorPolicy
) -> Iterator[tuple[int, Any]]:
    """``(line, raw_text)`` for every record of one file (or hub dataset) of ``source``."""
    if source.type != "files":
        yield from iter_hf_texts(source.name, source.config_name, source.split, source.text_field, source.max_docs)
        return
    assert path is not None
    for line, rec in iter_records(
        path, source.format, policy, cfg.max_record_bytes, [source.text_field], source.txt_mode, cfg.csv_multiline
    ):
        try:
            text = required_field(rec, source.text_field, path, line)  # missing or null: the task records' rules
        except DataError as err:
            policy.handle(err)
            continue
        yield line, text


def iter_source_texts(
    cfg: IngestConfig, policy: ErrorPolicy, root: Path, sources: dict[str, Counter[str]]
) -> Iterator[tuple[str, int, int, Any]]:
    """``(source, file group, line, raw_text)`` for every record of every configured corpus source.

    Every file (and hub dataset) gets an entry in ``sources`` before it is read, so one that
    contributes nothing is still counted, with zero.
    """
    for s, name, path, group in source_files(cfg, root):
        sources.setdefault(name, Counter())
        for line, text in iter_shard_texts(cfg, cfg.corpus.sources[s], name, path, policy):
            yield name, group, line, text


def source_files(cfg: IngestConfig, root: Path) -> list[tuple[int, str, Path | None, int]]:
    """``(source index, name, path, file group)`` of every file of every source, in read order; the groups
    (:func:`pipeline.text.corpus_shards.file_groups`) go by each file's size on disk."""
    found = [(s, name, path) for s, source in enumerate(cfg.corpus.sources) for name, path in shards_of(source, root)]
    sizes = [path.stat().st_size if path is not None else None for _, _, path in found]
    groups = file_groups(sizes, shard_bytes(cfg))
    return [(s, name, path, group) for (s, name, path), group in zip(found, groups, strict=True)]


def shard_bytes(cfg: IngestConfig) -> int:
    """``ingest.shard_mb`` in bytes."""
    return max(1, int(cfg.shard_mb * MB))


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
    step_seconds: dict[str, float] = field(default_factory=dict)  # where an engine's time went (the Ray engine's steps)
    cluster: dict[str, Any] = field(default_factory=dict)  # the Ray engine's: joined an existing cluster?, its CPUs
    shards: list[CorpusShard] = field(default_factory=list)  # the files written, in read order per split

    def merge(self, part: CorpusStats, examples: int) -> None:
        """Add the statistics of the next run of files (``part``, written on its own) to these; each examples list
        keeps its first ``examples`` entries in read order, as if one builder had met every document."""
        self.read += part.read
        self.kept.update(part.kept)
        self.dropped.update(part.dropped)
        self.characters += part.characters
        self.words += part.words
        for source, counts in part.sources.items():
            self.sources.setdefault(source, Counter()).update(counts)
        self.contaminated_by_task.update(part.contaminated_by_task)
        self.contaminated_by_source.update(part.contaminated_by_source)
        for task, shown in part.contamination_examples.items():
            mine = self.contamination_examples.setdefault(task, [])
            mine.extend(shown[: max(0, examples - len(mine))])
        self.near_duplicate_examples.extend(
            part.near_duplicate_examples[: max(0, examples - len(self.near_duplicate_examples))]
        )
        self.shards.extend(part.shards)


def wrong_type(raw: Any, source: str, line: int) -> DataError | None:
    """The error for a text field that is no string (a number, a list ...), or ``None``."""
    if isinstance(raw, str):
        return None
    return DataError(source, line, "wrong-type", f"text field must be a string, got {type(raw).__name__}")


def screen(raw: str, cfg: IngestConfig) -> tuple[str, int, str | None]:
    """``(normalised text, words, why the length filters drop it or None)`` of one document's raw text."""
    text = normalize_text(raw, cfg.unicode_form)
    words = text.count(" ") + 1 if text else 0  # whitespace is collapsed: spaces + 1
    return text, words, drop_reason(text, words, cfg.corpus)


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
    """Appends rows to a Parquet file, one row group per ``chunk`` rows; counts what it wrote."""

    def __init__(self, path: Path, chunk: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.writer = pq.ParquetWriter(path, CORPUS_SCHEMA)
        self.chunk = chunk
        self.rows: list[tuple[Any, ...]] = []
        self.written = self.characters = self.words = self.text_bytes = 0

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
            self.written += len(self.rows)
            self.characters += pc.sum(chars).as_py()
            self.words += sum(words)
            self.text_bytes += pc.sum(pc.binary_length(text)).as_py()  # UTF-8 bytes
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


class SplitShards:
    """One split's shards (:mod:`pipeline.text.corpus_shards`): a Parquet file per file group and piece, a piece
    closed at the end of the row group that brings it to ``shard_bytes`` of text."""

    def __init__(self, out_dir: Path, split: str, chunk: int, shard_bytes: int) -> None:
        self.out_dir, self.split, self.chunk, self.shard_bytes = out_dir, split, chunk, shard_bytes
        self.group, self.piece = -1, 0
        self.current: ChunkedParquet | None = None  # opened at its first row: an empty piece is no file
        self.shards: list[CorpusShard] = []

    def add(self, group: int, row: tuple[Any, ...]) -> None:
        if group != self.group:
            self.finish()
            self.group, self.piece = group, 0
        if self.current is None:
            self.current = ChunkedParquet(self.out_dir / shard_file(self.split, group, self.piece), self.chunk)
        self.current.add(row)
        if self.current.text_bytes >= self.shard_bytes:  # grows at a row group's end only
            self.finish()
            self.piece += 1

    def finish(self) -> None:
        """Close the open piece and list it."""
        if self.current is None:
            return
        w, self.current = self.current, None
        w.close()
        file = shard_file(self.split, self.group, self.piece)
        self.shards.append(CorpusShard(self.split, file, w.written, w.characters, w.words, file_digest(w.path)))


# what the near checks found for one document: the evaluation text it near-copies, the kept document it near-duplicates
NearResult = tuple[Contamination | None, tuple[str, float] | None]


@dataclass
class Pending:
    """A document that passed the filters, exact dedup and the exact leakage guard, waiting for the
    batched near-duplicate and contamination checks."""

    h: int
    text: str
    source: str
    group: int  # its file's group: which shards it goes to
    line: int
    words: int
    known: NearResult | None = None  # the checks' result where another engine computed it (pipeline.text.corpus_ray)


class NearChecks:
    """The batched checks of :mod:`pipeline.text.neardup`: near-duplicates (MinHash) and contamination
    (containment); either may be off."""

    def __init__(self, cfg: IngestConfig, evaluation: list[tuple[str, str, str]]) -> None:
        m, nd, dc = cfg.minhash, cfg.near_duplicates, cfg.decontamination
        self.duplicates = NearDuplicateIndex(nd.threshold, nd.shingle_words, m.num_perm, m.seed) if nd.enabled else None
        self.evaluation = (
            EvaluationIndex(evaluation, dc.threshold, dc.shingle_words, cfg.leakage_min_chars, dc.common_share)
            if dc.enabled
            else None
        )
        self.examples = dc.examples
        self.evaluation_texts = evaluation  # (task, split, text): what the indexes were built from
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
                    "containment": hit.containment,  # 1.0 for an exact copy (case and spacing aside): the leakage guard
                }
            )

    def results(self, batch: list[Pending]) -> list[NearResult]:
        """Per document: the evaluation text it near-copies and the kept document it near-duplicates (or ``None``s).

        Documents that another engine checked already (``Pending.known``) keep their results.
        """
        if all(p.known is not None for p in batch):
            return [p.known for p in batch if p.known is not None]
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
        return list(zip(found, dups, strict=True))

    def reasons(self, batch: list[Pending], stats: CorpusStats) -> list[str | None]:
        """Per document: ``"contaminated"``, ``"near_duplicate"`` or ``None`` (kept); examples go to ``stats``."""
        start = time.perf_counter()
        out: list[str | None] = []
        for doc, (hit, dup) in zip(batch, self.results(batch), strict=True):
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


class CorpusBuilder:
    """Screens documents one at a time and writes the kept ones to ``train``/``validation`` Parquet files."""

    def __init__(self, cfg: IngestConfig, out_dir: Path, guard: LeakageGuard, near: NearChecks) -> None:
        self.cfg, self.guard, self.near = cfg, guard, near
        self.stats = CorpusStats()
        self.seen: set[int] = set()  # 64-bit hashes of the documents kept so far (exact dedup)
        self.pending: list[Pending] = []  # waiting for the batched near checks
        self.writers = {s: SplitShards(out_dir, s, cfg.chunk_docs, shard_bytes(cfg)) for s in SPLITS}

    def add(self, source: str, group: int, line: int, raw: Any, policy: ErrorPolicy) -> None:
        """One raw record of ``source``: dropped (with its reason counted), kept, or queued for the near checks."""
        self.count_read(source)
        bad = wrong_type(raw, source, line)
        if bad is not None:
            policy.handle(bad)
            self.stats.dropped["bad_record"] += 1
            return
        text, words, reason = screen(raw, self.cfg)
        if reason is None:
            h = text_hash(text)
            reason = self.exact_reason(h, text, source, line)
        if reason:
            self.stats.dropped[reason] += 1
            return
        self.queue(Pending(h, text, source, group, line, words))

    def count_read(self, source: str) -> None:
        self.stats.read += 1
        self.stats.sources[source]["read"] += 1

    def queue(self, doc: Pending) -> None:
        """A document past the filters, exact dedup and the leakage guard: kept, or queued for the near checks."""
        if not self.near.active:
            self.keep(doc)
            return
        self.pending.append(doc)
        if len(self.pending) >= self.cfg.chunk_docs:
            self.flush()

    def exact_reason(self, h: int, text: str, source: str, line: int) -> str | None:
        """``"duplicate"`` (seen before), ``"leakage"`` (holds an evaluation text) or ``None``."""
        if h in self.seen:
            return "duplicate"
        self.seen.add(h)
        leak = self.guard.match(text)
        if leak is None:
            return None
        self.near.record(self.stats, Contamination(leak[0], leak[1], leak[2], leak[2], 1.0), source, line)
        return "leakage"

    def keep(self, doc: Pending) -> None:
        split = split_of_hash(doc.h, self.cfg.corpus.validation_fraction)
        self.writers[split].add(doc.group, (f"{doc.h:016x}", doc.text, doc.source, doc.line, doc.words))
        self.stats.kept[split] += 1
        self.stats.sources[doc.source]["kept"] += 1
        self.stats.characters += len(doc.text)
        self.stats.words += doc.words

    def flush(self) -> None:
        """Run the near checks on the queued documents; keep those that pass."""
        for doc, reason in zip(self.pending, self.near.reasons(self.pending, self.stats), strict=True):
            if reason:
                self.stats.dropped[reason] += 1
            else:
                self.keep(doc)
        self.pending.clear()

    def close(self) -> None:
        """Close the open shards; list every shard written in ``stats.shards``."""
        for writer in self.writers.values():
            writer.finish()
        self.stats.shards = [shard for split in SPLITS for shard in self.writers[split].shards]


def ingest_corpus(
    cfg: IngestConfig, out_dir: Path, guard: LeakageGuard, near: NearChecks, policy: ErrorPolicy, root: Path
) -> CorpusStats:
    """Stream every source through normalise -> filter -> dedup -> leakage -> near-duplicates and
    contamination (in batches of ``chunk_docs``) -> split -> Parquet shards (``stats.shards`` lists them)."""
    builder = CorpusBuilder(cfg, out_dir, guard, near)
    progress = Progress("ingest: corpus", None, "documents")  # a line every 10 s on a large corpus
    try:
        for source, group, line, raw in iter_source_texts(cfg, policy, root, builder.stats.sources):
            builder.add(source, group, line, raw, policy)
            if builder.stats.read % 1000 == 0:
                kept = builder.stats.kept
                progress.update(builder.stats.read, kept=kept["train"] + kept["validation"])
        if builder.pending:
            builder.flush()
    finally:
        builder.close()
        progress.close()
    return builder.stats


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
