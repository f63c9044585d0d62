"""params.yaml ``ingest``: corpus sources and filters, labelled tasks declared as data."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.sections.base import SPLITS, Strict


def task_kind(task_type: str) -> Any:
    """The task type's registry entry (imported here, not at the top: the registry imports this module's users)."""
    from pipeline.tasks.registry import REGISTRY

    if task_type not in REGISTRY:
        raise ValueError(f"unknown task type '{task_type}'; known types: {sorted(REGISTRY)}")
    return REGISTRY[task_type]


FileFormat = Literal["auto", "txt", "jsonl", "csv", "parquet", "conll"]


class FileSource(Strict):
    """Local files: a path or glob; ``.gz`` is read transparently."""

    type: Literal["files"]
    path: str = Field(min_length=1)
    format: FileFormat = "auto"
    text_field: str = "text"
    txt_mode: Literal["line", "paragraph"] = "line"


class HFSource(Strict):
    """A Hugging Face ``datasets`` id, read in streaming mode; needs network access."""

    type: Literal["hf"]
    name: str = Field(min_length=1)
    config_name: str | None = None
    split: str = "train"
    text_field: str = "text"
    max_docs: int | None = Field(default=None, ge=1)


CorpusSource = Annotated[FileSource | HFSource, Field(discriminator="type")]


class CorpusConfig(Strict):
    sources: list[CorpusSource] = Field(min_length=1)
    min_chars: int = Field(ge=0)
    max_chars: int = Field(ge=1)
    min_words: int = Field(ge=0)
    max_words: int = Field(ge=1)
    validation_fraction: float = Field(ge=0, lt=1)

    @model_validator(mode="after")
    def _check_bounds(self) -> CorpusConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) > max_chars ({self.max_chars})")
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) > max_words ({self.max_words})")
        return self


class TaskConfig(Strict):
    """A labelled task declared as data: its type picks the head, fields map file columns."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    type: str  # a name in pipeline.tasks.registry.REGISTRY
    files: dict[str, str]
    format: FileFormat = "auto"
    fields: dict[str, str] = Field(default_factory=dict)
    labels: list[str] | None = None

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        task_kind(value)
        return value

    @model_validator(mode="after")
    def _check_files_and_fields(self) -> TaskConfig:
        kind = task_kind(self.type)
        if self.labels is not None:
            dupes = sorted({x for x in self.labels if self.labels.count(x) > 1})
            if dupes:
                raise ValueError(f"labels: duplicate label(s) {dupes}; each label once")
            if len(self.labels) < kind.min_labels:
                raise ValueError(
                    f"labels: a {self.type} task needs at least {kind.min_labels} labels, got {self.labels}"
                )
        unknown = sorted(set(self.files) - set(SPLITS))
        if unknown:
            raise ValueError(f"files: unknown split(s) {unknown}; expected keys among {list(SPLITS)}")
        missing = [s for s in SPLITS if s not in self.files]
        if missing:
            raise ValueError(f"files: missing split(s) {missing}; train, validation and test are required")
        allowed = kind.fields
        bad = sorted(set(self.fields) - set(allowed))
        if bad:
            raise ValueError(
                f"fields: unknown key(s) {bad} for type {self.type}; expected keys among {sorted(allowed)}"
            )
        return self

    def field(self, key: str) -> str:
        """Column/key name in the task's files for the logical field ``key``."""
        return self.fields.get(key, task_kind(self.type).fields[key])


class NearDuplicatesConfig(Strict):
    """Corpus documents that near-copy an earlier kept document (MinHash LSH over word n-grams)."""

    enabled: bool
    threshold: float = Field(gt=0, le=1)  # Jaccard of the two documents' word n-gram sets
    shingle_words: int = Field(ge=1, le=32)  # n of the word n-grams


class DecontaminationConfig(Strict):
    """Corpus documents holding a near-copy of a sentence of any task's validation or test inputs."""

    enabled: bool
    threshold: float = Field(gt=0, le=1)  # share of an evaluation sentence's shingles a corpus sentence holds
    shingle_words: int = Field(ge=1, le=32)
    common_share: float = Field(ge=0, le=1)  # shingles more of the evaluation sentences hold are common (see neardup)
    examples: int = Field(ge=0, le=100)  # per task, in reports/ingest.json and the run report


class MinHashConfig(Strict):
    num_perm: int = Field(
        ge=16, le=1024
    )  # signature length: the Jaccard estimate's standard error ~ 0.5 / sqrt(num_perm)
    seed: int = Field(ge=0, lt=2**32)


class IngestConfig(Strict):
    engine: Literal["local", "ray"]
    index: Literal["memory", "disk"]  # the local engine's dedup indexes: in RAM (~0.85 KB per kept document) or on disk
    corpus: CorpusConfig
    tasks: list[TaskConfig]
    unicode_form: Literal["NFC", "NFKC"]
    on_error: Literal["fail", "skip"]
    max_record_bytes: int = Field(ge=1024)
    csv_multiline: bool = False
    chunk_docs: int = Field(ge=1)
    shard_mb: float = Field(gt=0)  # MB (10**6 bytes) of text per corpus shard, and of source files per file group
    leakage_min_chars: int = Field(ge=1)
    near_duplicates: NearDuplicatesConfig
    decontamination: DecontaminationConfig
    minhash: MinHashConfig

    @model_validator(mode="after")
    def _unique_task_names(self) -> IngestConfig:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tasks: duplicate task name(s) {dupes}")
        return self
