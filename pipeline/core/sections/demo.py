"""params.yaml ``demo``: sizes of the seeded synthetic domain."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.core.sections.base import Seed, Strict


class DemoConfig(Strict):
    """Sizes of the seeded synthetic pharmacology domain (``python -m pipeline demo``)."""

    seed: Seed
    corpus_docs: int = Field(ge=1)
    sentences_per_doc: list[int] = Field(min_length=2, max_length=2)
    drugs: int = Field(ge=4)  # a quarter each reserved for validation and test examples
    targets: int = Field(ge=4)  # molecular targets of the drugs, split like them
    diseases: int = Field(ge=4)
    role_examples: int = Field(ge=10)
    pair_examples: int = Field(ge=10)
    ner_examples: int = Field(ge=10)
    qa_examples: int = Field(ge=10)
    eval_fraction: float = Field(gt=0, lt=0.5)

    @model_validator(mode="after")
    def _check_range(self) -> DemoConfig:
        lo, hi = self.sentences_per_doc
        if not 1 <= lo <= hi:
            raise ValueError(f"sentences_per_doc must be [min, max] with 1 <= min <= max, got {self.sentences_per_doc}")
        return self
