"""``reports/finetune.json``: each fine-tuned model's training summary (the adapted model and the baseline), the
precision they trained in, how the baseline's budget was set, the tasks as trained, and, where asked, the search's
choices and one model per task.

Timings and what a run found left by an earlier one (``train_seconds``, ``train_examples_per_s``, ``resumed_from``,
``checkpoint_log``, ``pretrain_seconds``, ``adapted_steps_per_s``) are its measured half (``reports/measured/``).
The fields are declared in the order the stage writes them: a report is rewritten byte for byte.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.core.reports.base import StageReport


class ModelSummary(StageReport):
    """A contender's fine-tuning run (``adapted``, ``baseline``): its encoder, then ``training/trainer.py:train``'s
    summary."""

    encoder: str  # the encoder's directory or base-model id
    vocab_size: int
    resumed_from: str | None = None  # measured: the checkpoint this session resumed
    checkpoint_log: list[str] = Field(default_factory=list)  # measured: what was done with the checkpoints found
    steps: int
    best_step: int
    stopped_early: bool
    best_dev_mean_primary: float | None  # None: no dev evaluation ran
    planned_epochs: dict[str, float]  # passes over each task's train split the step budget plans
    train_seconds: float | None = None  # measured
    train_examples_per_s: float | None = None  # measured; None: nothing was left to train (a finished run resumed)


class SingleTaskScore(ModelSummary):
    """``finetune.single_task``: one model per task, the adapted encoder, same recipe and budget; its test metrics."""

    test: dict[str, float | dict[str, Any]]  # the task's test metrics (a token task's per entity type too)
    primary: str


class BaselineBudget(StageReport):
    """``finetune.baseline_budget: same_compute``: the pretraining seconds given to the baseline as more steps."""

    mode: Literal["same_compute"]
    pretrain_seconds: float | None = None  # measured
    adapted_steps_per_s: float | None = None  # measured: the speed the seconds were converted at
    extra_steps: int


class SideBySide(StageReport):
    """The models trained at the same time, one process of ``threads_each`` threads each."""

    processes: int
    threads_each: int


class TaskTrained(StageReport):
    """A task as the models were fine-tuned on it."""

    type: str
    primary: str
    labels: list[str]
    train_features: int


class FinetuneReport(StageReport):
    """reports/finetune.json."""

    adapted: ModelSummary
    baseline: ModelSummary | None = None  # absent with finetune.baseline: false
    search: dict[str, dict[str, Any]] | None = None  # per model, the values the search chose (search.enabled)
    baseline_budget: BaselineBudget | None = None  # finetune.baseline_budget: same_compute
    precision: str
    precision_reason: str
    side_by_side: SideBySide | None = None  # absent when the models trained one after the other
    tasks: dict[str, TaskTrained]
    single_task: dict[str, SingleTaskScore] | None = None  # finetune.single_task

    def model(self, name: str) -> ModelSummary | None:
        """The summary of the contender ``name`` (``adapted``, ``baseline``), ``None`` if it was not trained."""
        return {"adapted": self.adapted, "baseline": self.baseline}.get(name)
