"""params.yaml ``validate``: thresholds of the Great Expectations suites."""

from __future__ import annotations

from pydantic import Field, model_validator

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

    @model_validator(mode="after")
    def _check_ranges(self) -> CorpusChecks:
        # a range no data can meet is a settings mistake (exit 2), not a data failure after ingest
        for low, high in (("median_chars_min", "median_chars_max"), ("min_chars", "max_chars")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(
                    f"{low} ({getattr(self, low)}) is above {high} ({getattr(self, high)}): no corpus can pass"
                )
        return self


class TaskChecks(Strict):
    min_examples_per_label: int = Field(ge=0)
    max_train_overlap: float = Field(ge=0, le=1)
    min_examples: int = Field(ge=0)


class ValidateConfig(Strict):
    corpus: CorpusChecks
    tasks: TaskChecks
    max_offending_records: int = Field(ge=0, le=100)
