"""``reports/metrics.json``: the evaluate stage's test metrics of every task for the adapted model, the baseline and
the task's trivial baseline, the gain with its paired bootstrap CI, the means, the verdict and the red flags.

Its one timing, ``seconds``, is the measured half (``reports/measured/``). Fields are declared in the order the stage
writes them: a report is rewritten byte for byte (DVC reads it as a metrics file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pipeline.core.reports.base import StageReport

Breakdown = dict[str, dict[str, float | int]]  # per entity type or per label: precision, recall, f1, support
Scores = dict[str, float | Breakdown]  # a model's test metrics on one task (0-1), and its breakdown where it has one
Model = Literal["adapted", "baseline", "trivial"]


class EvaluationSummary(StageReport):
    """Means over the tasks of the primary metric, the mean gain with its CI, how many tasks improved, and the
    held-out perplexities (the pretrain stage's; None without one)."""

    mean_primary_adapted: float
    mean_primary_baseline: float | None = None  # the baseline's keys: absent with finetune.baseline: false
    mean_primary_trivial: float | None = None
    mean_primary_delta: float | None = None
    mean_primary_delta_low: float | None = None  # the mean gain's bootstrap CI (absent where it is NaN)
    mean_primary_delta_high: float | None = None
    tasks_improved: int | None = None
    tasks_improved_significantly: int | None = None  # the whole paired CI above 0
    perplexity_base: float | None
    perplexity_adapted: float | None

    @property
    def gain_interval(self) -> tuple[float, float] | None:
        """The mean gain's CI, or None where there is none."""
        low, high = self.mean_primary_delta_low, self.mean_primary_delta_high
        return None if low is None or high is None else (low, high)


class TaskEvaluation(StageReport):
    """One task's test metrics: each model's, the trivial baseline's, and the adapted-minus-baseline gain."""

    type: str  # the task type (pipeline.tasks.registry)
    primary: str  # the primary metric's key in each model's scores
    test_examples: int
    trivial_baseline: str  # what the trivial baseline is (majority class, all O, ...)
    trivial: Scores
    adapted: Scores
    baseline: Scores | None = None
    primary_ci: dict[str, list[float]]  # per model: its own bootstrap CI of the primary metric ([NaN, NaN]: none)
    delta: float | None = None  # adapted - baseline, primary metric; with its paired bootstrap CI
    ci_low: float | None = None
    ci_high: float | None = None

    def scores(self, model: Model) -> Scores | None:
        """``model``'s test metrics on this task, None where it was not scored."""
        return {"adapted": self.adapted, "baseline": self.baseline, "trivial": self.trivial}[model]

    def score(self, model: Model) -> float | None:
        """``model``'s primary metric (0-1), None where it was not scored."""
        scores = self.scores(model)
        return None if scores is None else scalar(scores, self.primary)

    def breakdown(self, model: Model, key: str) -> Breakdown:
        """``model``'s scores per entity type (``per_type``) or per label (``per_label``); empty where it has none."""
        value = (self.scores(model) or {}).get(key)
        return value if isinstance(value, dict) else {}

    def interval(self, model: str) -> tuple[float, float] | None:
        """``model``'s own CI of the primary metric, None where there is none (no resamples: NaN)."""
        low, high = self.primary_ci.get(model) or (math.nan, math.nan)
        return None if math.isnan(low) or math.isnan(high) else (low, high)

    @property
    def gain(self) -> tuple[float, float, float] | None:
        """``(delta, low, high)``: the gain and its paired CI, None without a baseline."""
        if self.delta is None or self.ci_low is None or self.ci_high is None:
            return None
        return self.delta, self.ci_low, self.ci_high


class Bootstrap(StageReport):
    resamples: int
    confidence: float  # e.g. 0.95


class Precisions(StageReport):
    """The precision each stage ran in (``bf16``, ``fp32``; None: the stage's report is not there)."""

    pretrain: str | None
    finetune: str | None
    evaluate: str


class SingleTaskTest(StageReport):
    """``finetune.single_task``: the test metrics of the one model trained on this task alone."""

    primary: str
    test: Scores

    @property
    def score(self) -> float | None:
        """The single-task model's primary test metric (0-1)."""
        return scalar(self.test, self.primary)


class EvaluationReport(StageReport):
    """reports/metrics.json."""

    summary: EvaluationSummary
    tasks: dict[str, TaskEvaluation]
    bootstrap: Bootstrap
    precision: Precisions
    verdict: list[str] | None = None  # adapted vs baseline in two sentences (needs a baseline and a pretrain report)
    watch: list[str]  # red flags, one sentence each
    synthetic: bool  # every task read from the embedded demo domain
    single_task: dict[str, SingleTaskTest] | None = None
    seconds: float | None = None  # measured

    @property
    def has_baseline(self) -> bool:
        """Whether the un-adapted baseline was scored (and so the gains)."""
        return self.summary.mean_primary_delta is not None

    def version_scores(self) -> VersionScores:
        """The adapted (full) model's test scores, as a registered version carries them."""
        tasks = {
            name: ServedTask(t.primary, t.adapted, t.trivial, t.interval("adapted")) for name, t in self.tasks.items()
        }
        return VersionScores(tasks, self.summary.mean_primary_adapted)


def scalar(scores: Scores, key: str) -> float | None:
    """The metric ``key`` of a model's scores; None where it is missing or a breakdown (per type, per label)."""
    value = scores.get(key)
    return None if isinstance(value, dict) or value is None else float(value)


def number(scores: Scores, key: str) -> float:
    """The metric ``key`` of a model's scores, which must be there (a primary metric)."""
    value = scalar(scores, key)
    if value is None:
        raise KeyError(f"no scalar metric {key!r} in {sorted(scores)}")
    return value


@dataclass(frozen=True)
class ServedTask:
    """One task's test scores of a model the registry holds (the full model or a compressed variant)."""

    primary: str
    scores: Scores  # the model's test metrics on the task
    trivial: Scores  # the task's trivial baseline's
    interval: tuple[float, float] | None  # the model's own CI of the primary metric (None: not measured)

    @property
    def score(self) -> float:
        """The primary metric (0-1)."""
        return number(self.scores, self.primary)

    @property
    def trivial_score(self) -> float:
        return number(self.trivial, self.primary)


@dataclass(frozen=True)
class VersionScores:
    """A registered model's test scores per task and their mean primary metric (its tags, card and description)."""

    tasks: dict[str, ServedTask]
    mean_primary: float

    def metric_values(self) -> dict[str, float]:
        """Every scalar test metric, keyed ``task.metric`` (lineage.json's record)."""
        return {
            f"{task}.{name}": float(value)
            for task, t in self.tasks.items()
            for name, value in t.scores.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
