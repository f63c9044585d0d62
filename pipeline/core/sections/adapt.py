"""params.yaml ``adapt``: which adaptation the pipeline trains (fixed, or chosen on the dev splits by a tournament)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.sections.base import Seed, Strict

# The arms a tournament may compare. none: the base model, its adaptation minutes spent on fine-tuning instead;
# dapt: masked-LM on the corpus; tapt: on the tasks' own train inputs only; dapt+tapt: on both, mixed;
# nearest+tapt: kNN-TAPT (the select stage's corpus blocks nearest to the train inputs, pretrain.selection.k each) with
# the tasks' text; contrastive: unsupervised SimCSE on the corpus (pretrain.objective: simcse), the sentence encoder's
# own objective.
Arm = Literal["none", "dapt", "tapt", "dapt+tapt", "nearest+tapt", "contrastive"]
ARM_NAMES = {  # for people
    "none": "fine-tuning alone",
    "dapt": "DAPT",
    "tapt": "TAPT",
    "dapt+tapt": "DAPT+TAPT",
    "nearest+tapt": "kNN-TAPT",
    "contrastive": "contrastive (SimCSE)",
}


class FirstRung(Strict):
    """The budget of every arm in the tournament's first rung; each later rung multiplies both by ``1 / keep``."""

    pretrain_minutes: float = Field(gt=0)  # wall-clock minutes of adaptation (masked-LM training) per arm
    # fine-tuning steps per arm and seed (none: more, by its adaptation minutes); None: the last rung fine-tunes the
    # final budget (finetune.max_steps, or the steps of its epochs), each earlier one keep x the next
    finetune_steps: int | None = Field(default=None, ge=10)


class AdaptConfig(Strict):
    strategy: Literal["fixed", "auto"]  # fixed: pretrain as its section says; auto: a tournament on the dev splits
    arms: list[Arm] = Field(min_length=2)
    # the whole tournament's wall-clock minutes (adaptation and fine-tuning of every arm and rung): the adaptation
    # minutes alone must fit (checked here); a rung whose measured cost would overrun is not started (checked as it runs)
    budget_minutes: float = Field(gt=0)
    rungs: int = Field(ge=1, le=6)  # successive halving: rounds of the tournament
    keep: float = Field(gt=0, lt=1)  # share of the arms a rung passes on (at least one); budgets grow by 1 / keep
    first_rung: FirstRung
    seeds: list[Seed] = Field(min_length=1, max_length=5)  # fine-tuning seeds per arm (their dev mean is the score)

    @field_validator("arms")
    @classmethod
    def _distinct_with_none(cls, arms: list[str]) -> list[str]:
        if len(set(arms)) != len(arms):
            raise ValueError(f"each arm once: {arms}")
        if "none" not in arms:
            raise ValueError(f"'none' must be an arm: every adaptation is judged against fine-tuning alone ({arms})")
        return arms

    def needs_selection(self) -> bool:
        """Whether the tournament trains on the select stage's nearest blocks (the ``nearest+tapt`` arm)."""
        return self.strategy == "auto" and "nearest+tapt" in self.arms

    def survivors(self) -> list[int]:
        """How many adaptation arms each rung trains (``none``, the reference, runs in every rung besides them): all
        in the first, then ``ceil(keep x previous)``, at least one."""
        counts = [len(self.arms) - 1]
        for _ in range(self.rungs - 1):
            counts.append(max(1, math.ceil(self.keep * counts[-1])))
        return counts

    def rung_pretrain_minutes(self, rung: int) -> float:
        """An adaptation arm's cumulative pretraining minutes at ``rung`` (0-based): a rung resumes the one before."""
        return self.first_rung.pretrain_minutes / self.keep**rung

    def rung_finetune_steps(self, rung: int, final_steps: int) -> int:
        """Fine-tuning steps of an adaptation arm at ``rung`` (each rung fine-tunes anew from its encoder): by default
        the last rung's are the final fine-tuning's ``final_steps``, so the decision against ``none`` is made at the
        budget the chosen arm is then trained with (at a few hundred steps the fine-tuning curve is still steep, and
        minutes taken from it cost an adaptation arm more than they will in the final run)."""
        if self.first_rung.finetune_steps is None:
            return max(10, round(final_steps * self.keep ** (self.rungs - 1 - rung)))
        return round(self.first_rung.finetune_steps / self.keep**rung)

    def planned_pretrain_minutes(self) -> float:
        """The adaptation minutes the schedule spends: each rung's arms extend their pretraining to its minutes."""
        total, previous = 0.0, 0.0
        for rung, count in enumerate(self.survivors()):
            now = self.rung_pretrain_minutes(rung)
            total += count * (now - previous)
            previous = now
        return total

    @model_validator(mode="after")
    def _fits_budget(self) -> AdaptConfig:
        if self.strategy == "auto" and (planned := self.planned_pretrain_minutes()) > self.budget_minutes + 1e-9:
            raise ValueError(
                f"budget_minutes ({self.budget_minutes:g}) is below the adaptation minutes alone that the rung schedule "
                f"spends ({planned:.2f} min: adaptation arms per rung {self.survivors()}, the first rung "
                f"{self.first_rung.pretrain_minutes:g} min each, growing x{1 / self.keep:g} a rung): "
                "raise budget_minutes, or lower first_rung.pretrain_minutes, rungs or the arms"
            )
        return self
