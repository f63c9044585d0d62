"""params.yaml ``validate``: thresholds of the Great Expectations suites."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict


class CorpusChecks(Strict):
    min_docs: int = Field(ge=0)
    min_chars: int = Field(ge=0)
    max_chars: int = Field(ge=1)
    length_mostly: float = Field(gt=0, le=1)
    median_chars_min: float = Field(ge=0)
    median_chars_max: float = Field(ge=0)
    max_duplicate_ratio: float = Field(ge=0, le=1)
    max_replacement_char_share: float = Field(ge=0, le=1)
    max_nonprintable_share: float = Field(ge=0, le=1)
    max_docs_checked: int = Field(ge=1)


class TaskChecks(Strict):
    min_examples_per_label: int = Field(ge=0)
    max_train_overlap: float = Field(ge=0, le=1)
    min_examples: int = Field(ge=0)


class ValidateConfig(Strict):
    corpus: CorpusChecks
    tasks: TaskChecks
    max_offending_records: int = Field(ge=0, le=100)
