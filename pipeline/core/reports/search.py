"""``reports/search.json``: the search stage's Optuna studies, one per model (``search.enabled``): the space, every
trial's values, state and dev score, and the values chosen on dev (``data/search/chosen.json``, which finetune reads).

The stage's ``seconds`` is its measured half (``reports/measured/``). Fields are declared in the order the stage
writes them.
"""

from __future__ import annotations

from typing import Any, Literal

from pipeline.core.reports.base import StageReport

Value = int | float  # a searched setting's value (a learning rate, a step count): int first, so 439 stays an int


class Trial(StageReport):
    """One trial: the values tried, how it ended, and its best dev mean primary where it trained to an evaluation."""

    trial: int  # Optuna's number, from 0 (trial 0 runs params.yaml's settings)
    values: dict[str, Value]
    state: Literal["failed", "diverged", "pruned", "complete"]
    seconds: float | None = None
    steps: int | None = None
    dev_mean_primary: float | None = None


class ModelStudy(StageReport):
    """A model's study: the values chosen, the trial that chose them and its dev score, params.yaml's dev score."""

    chosen: dict[str, Value]
    chosen_trial: int
    chosen_dev_mean_primary: float
    default_dev_mean_primary: float | None  # None: params.yaml's trial did not complete
    trials: list[Trial]
    seconds: float | None = None  # measured


class SearchReport(StageReport):
    """reports/search.json (``enabled: false`` alone when the search is off)."""

    enabled: bool
    trials_per_model: int | None = None
    budget_minutes: float | None = None
    pruner: str | None = None
    space: dict[str, dict[str, Any]] | None = None  # search.space as configured: each setting's range
    models: dict[str, ModelStudy] | None = None
    seconds: float | None = None  # measured
