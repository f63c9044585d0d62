"""``reports/adapt.json``: the adaptation the adapt stage chose. Under ``adapt.strategy: fixed`` the strategy alone;
under ``auto`` the tournament (``training/tournament.py``): every arm's dev scores per rung, what each cost, the
choice and its reason.

Timings (``seconds``, ``minutes``, ``minutes_used``, an arm's ``pretrain_seconds`` and its runs'
``finetune_seconds``) are the measured half (``reports/measured/``). Fields are declared in the order the stage
writes them: a report is rewritten byte for byte.
"""

from __future__ import annotations

from typing import Literal

from pipeline.core.reports.base import StageReport


class ArmRun(StageReport):
    """One (arm, rung, seed) fine-tuning run and its dev scores (primary metric per task, 0-1)."""

    arm: str
    rung: int
    seed: int
    finetune_steps: int
    finetune_seconds: float | None = None  # measured
    dev: dict[str, float]
    dev_mean: float


class ArmEntry(StageReport):
    """An arm in a rung: its seeds' dev mean (its score) and what it cost, per seed."""

    dev_mean: float
    dev: dict[str, float]
    pretrain_seconds: float | None = None  # measured: the arm's adaptation so far (0 for none)
    minutes: float | None = None  # measured: adaptation + fine-tuning minutes of one seed (what equal compute compares)
    runs: list[ArmRun]
    extra_steps: int | None = None  # none only: the fine-tuning steps its adaptation minutes bought


class Rung(StageReport):
    """A round of successive halving: its budgets, every arm that played, the arms that go on."""

    rung: int  # 0-based
    pretrain_minutes: float  # each adaptation arm's cumulative adaptation minutes
    finetune_steps: int
    arms: dict[str, ArmEntry]
    kept: list[str]


class DevDelta(StageReport):
    """The best adaptation arm minus none in the dev mean primary metric, with its paired bootstrap interval."""

    delta: float
    low: float
    high: float


class AdaptReport(StageReport):
    """reports/adapt.json."""

    strategy: Literal["fixed", "auto"]
    arms: list[str] | None = None  # auto: the arms as configured
    budget_minutes: int | float | None = None  # as configured (an int stays one: the report keeps its bytes)
    keep: float | None = None
    minutes_used: float | None = None  # measured
    stopped_early: str | None = None  # why the next rung was not started (None: every rung played)
    rungs: list[Rung] | None = None
    digest: str | None = None  # the tournament's work folder under checkpoints/adapt/
    chosen: str | None = None  # the arm pretrain trains ("none": the base model kept)
    best_adaptation: str | None = None
    dev_delta: DevDelta | None = None
    reason: str | None = None  # one sentence: why that arm
    seconds: float | None = None  # measured: the stage's wall clock

    @property
    def played(self) -> bool:
        """Whether a tournament ran (``adapt.strategy: auto``) and left its rungs and choice."""
        return self.strategy == "auto" and bool(self.rungs) and self.chosen is not None and self.reason is not None
