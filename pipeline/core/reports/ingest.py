"""``reports/ingest.json``: what the ingest stage read and kept: the corpus (documents per split, what was dropped and
why, bad records skipped with a few examples, per source), each task's splits, the leakage guard, near-duplicates,
decontamination, and the engine that did it.

Timings (``seconds``, ``near_checks_seconds``, ``engine_seconds``) are its measured half (``reports/measured/``).
Fields are declared in the order the stage writes them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.reports.base import StageReport


class SkippedRecord(StageReport):
    """A bad record skipped under ``ingest.on_error: skip``: the file, the line, the rule it broke, the detail."""

    file: str
    line: int | None
    rule: str
    detail: str


class SourceCount(StageReport):
    """Documents a corpus source gave, and how many of them were kept."""

    read: int
    kept: int


class CorpusIngested(StageReport):
    """The domain corpus as ingested."""

    documents_read: int
    documents_kept: int
    train_documents: int
    validation_documents: int
    dropped: dict[str, int]  # reason (duplicate, too_short, leakage, contaminated, ...) -> documents
    errors_skipped: dict[str, int]  # rule -> bad records skipped
    error_examples: list[SkippedRecord]
    duplicate_ratio: float  # exact duplicates / documents read
    characters: int
    words: int
    shards: dict[str, int]  # split -> Parquet shards written
    sources: dict[str, SourceCount]
    empty_sources: list[str]  # sources that contributed no document


class SplitIngested(StageReport):
    """A task split: the examples kept and the records skipped."""

    examples: int
    skipped: int


class TaskIngested(StageReport):
    """A task as ingested: its type, its splits, its labels and where they came from."""

    type: str
    splits: dict[str, SplitIngested]
    labels: int
    labels_from: Literal["train", "params", "none"]


class Leakage(StageReport):
    """The leakage guard: evaluation texts indexed, corpus documents dropped for holding one."""

    evaluation_texts_indexed: int
    documents_dropped: int


class NearDuplicate(StageReport):
    """A corpus document dropped as a near-duplicate of an earlier kept one."""

    source: str
    line: int | None
    near_copy_of: str
    jaccard: float


class NearDuplicates(StageReport):
    """``ingest.near_duplicates`` as run: the settings, the documents dropped, a few examples."""

    enabled: bool
    threshold: float
    shingle_words: int
    documents_dropped: int
    examples: list[NearDuplicate]


class Contamination(StageReport):
    """A corpus document dropped for holding (a near-copy of) a validation or test sentence."""

    source: str
    line: int | None
    split: str
    evaluation_sentence: str
    corpus_sentence: str
    containment: float  # the share of the evaluation sentence's shingles the corpus sentence holds (1.0: a copy)


class Decontamination(StageReport):
    """``ingest.decontamination`` as run: the documents dropped per task and source, with examples."""

    enabled: bool
    threshold: float
    shingle_words: int
    evaluation_sentences_indexed: int
    documents_dropped: int
    exact_copies: int
    near_copies: int
    by_task: dict[str, int]
    by_source: dict[str, int]
    examples: dict[str, list[Contamination]]  # per task


class IngestReport(StageReport):
    """reports/ingest.json."""

    corpus: CorpusIngested
    tasks: dict[str, TaskIngested]
    task_errors_skipped: dict[str, int]
    task_error_examples: list[SkippedRecord]
    leakage: Leakage
    near_duplicates: NearDuplicates
    decontamination: Decontamination
    engine: Literal["local", "ray"]
    index: Literal["memory", "disk"] | None  # None: the Ray engine
    engine_cluster: dict[str, bool | int] = Field(default_factory=dict)  # ray: joined (an existing cluster), cpus
    seconds: float | None = None  # measured
    near_checks_seconds: float | None = None  # measured: of them, the batched MinHash checks
    engine_seconds: dict[str, float] | None = None  # measured: the Ray engine's and the on-disk index's steps
