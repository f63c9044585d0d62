"""A declared task as a model sees it: its name, its type (bound once), its labels and fine-tuning settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from pipeline.tasks.base import TaskType
from pipeline.tasks.registry import kind_of

if TYPE_CHECKING:
    from pipeline.core.sections.finetune import FinetuneTaskConfig


@dataclass(frozen=True)
class TaskSpec:
    """One declared task as the model sees it: type, label map and its fine-tuning settings.

    ``kind`` is the type's registry entry, looked up once (an unknown type raises ``DataError`` naming the
    known ones): the model, collators, scoring and serving call its methods through the spec.
    """

    name: str
    type: str
    labels: list[str]
    settings: FinetuneTaskConfig

    @cached_property
    def kind(self) -> TaskType:
        return kind_of(self.type)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def primary(self) -> str:
        return self.settings.metric or self.kind.metrics[0]
