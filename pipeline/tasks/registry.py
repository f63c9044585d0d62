"""The task types adaptbert knows: one :class:`~pipeline.tasks.base.TaskType` per module, listed here once.

Adding a task type is one module under ``pipeline/tasks/`` (a ``TaskType`` subclass) and one line
below; nothing else in the code base names a type.
"""

from __future__ import annotations

from pipeline.core.errors import DataError
from pipeline.tasks.base import TaskType
from pipeline.tasks.extractive_qa import ExtractiveQA
from pipeline.tasks.multilabel_classification import MultilabelClassification
from pipeline.tasks.pair_classification import PairClassification
from pipeline.tasks.regression import Regression
from pipeline.tasks.sequence_classification import SequenceClassification
from pipeline.tasks.token_classification import TokenClassification

REGISTRY: dict[str, TaskType] = {
    kind.name: kind
    for kind in (
        SequenceClassification(),
        PairClassification(),
        TokenClassification(),
        ExtractiveQA(),
        MultilabelClassification(),
        Regression(),
    )
}


def kind_of(task_type: str, where: str = "tasks.json") -> TaskType:
    """The registry entry of ``task_type``; an unknown type names the known ones."""
    if task_type not in REGISTRY:
        raise DataError(
            where, None, "unknown-task-type", f"unknown task type '{task_type}'; known types: {sorted(REGISTRY)}"
        )
    return REGISTRY[task_type]
