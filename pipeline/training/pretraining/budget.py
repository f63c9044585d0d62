"""The wall-clock budget of pretraining (``pretrain.budget_minutes``): the step count planned from the measured speed
after a few timed steps, kept by a resumed run, and the schedule and report that follow from it.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from pipeline.core.console import note
from pipeline.core.paths import Paths
from pipeline.core.sections.pretrain import PretrainConfig

NO_STEP_CAP = 1_000_000  # pretrain.max_steps that a budget_minutes run never reaches (the tournament's arms)
BUDGET_CALIBRATION = 8  # optimiser steps timed (after WarmupTimer's warm-up steps) before a budget plans the step count
BUDGET_PLAN = "budget-plan.json"  # in checkpoints/pretrain/: the planned steps, so that a resumed run keeps them


class WarmupTimer(TrainerCallback):
    """Times the first ``WARMUP_STEPS`` optimiser steps of a session apart from the rest.

    The first steps build kernels (oneDNN bf16 primitives on CPU, CUDA graphs/autotuning), so
    they are slower; ``warm_tokens_per_s`` is the steady-state throughput after them.
    """

    WARMUP_STEPS = 2

    def __init__(self) -> None:
        self.start = self.warm_at = self.end = 0.0
        self.start_step = self.warm_tokens = self.end_tokens = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start, self.start_step = time.perf_counter(), state.global_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now, seen = time.perf_counter(), int(state.num_input_tokens_seen)
        if state.global_step - self.start_step == self.WARMUP_STEPS:
            self.warm_at, self.warm_tokens = now, seen
        self.end, self.end_tokens = now, seen

    def summary(self) -> dict[str, Any]:
        """``warmup_seconds`` (first steps) and ``warm_tokens_per_s`` (the rest); ``None`` where too few steps ran."""
        if not self.warm_at:
            return {"warmup_seconds": None, "warm_tokens_per_s": None}
        warm = self.end - self.warm_at
        return {
            "warmup_seconds": round(self.warm_at - self.start, 1),
            "warm_tokens_per_s": round((self.end_tokens - self.warm_tokens) / warm) if warm > 0 else None,
        }


class BudgetPlan(TrainerCallback):
    """Plans the step count that ends training on ``pretrain.budget_minutes`` of wall-clock time.

    After the warm-up steps and ``BUDGET_CALIBRATION`` timed ones it knows the time per step; with
    the time one evaluation takes (measured before training on the same fixed masks) and one every
    ``eval_steps``, the steps left are ``remaining_seconds / (step + evaluation / eval_steps)``. The
    plan sets ``state.max_steps`` (the Trainer stops and saves there) and ``total``, which the LR
    schedule reads: warmup does not depend on the total, so a plan made during warmup gives exactly
    the schedule of a run started with that many steps.
    """

    def __init__(self, budget_minutes: float, cap: int, eval_steps: int, eval_seconds: float, path: Path) -> None:
        self.budget_s, self.cap, self.eval_steps, self.eval_seconds, self.path = (
            budget_minutes * 60,
            cap,
            eval_steps,
            eval_seconds,
            path,
        )
        saved = json.loads(path.read_text()) if path.exists() else None
        self.total: int = saved["planned_steps"] if saved else cap
        self.planned: dict[str, Any] | None = saved
        self.start = self.timed_from = 0.0
        self.start_step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start, self.start_step = time.perf_counter(), state.global_step
        state.max_steps = self.total

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.planned is not None:
            return
        done = state.global_step - self.start_step
        if done == WarmupTimer.WARMUP_STEPS:
            self.timed_from = time.perf_counter()
        elif done == WarmupTimer.WARMUP_STEPS + BUDGET_CALIBRATION:
            now = time.perf_counter()
            step_s = (now - self.timed_from) / BUDGET_CALIBRATION
            remaining = self.budget_s - (now - self.start)
            more = int(max(remaining, 0.0) / (step_s + self.eval_seconds / self.eval_steps))
            self.total = max(state.global_step, min(self.cap, state.global_step + more))
            state.max_steps = self.total
            self.planned = {
                "planned_steps": self.total,
                "budget_minutes": round(self.budget_s / 60, 3),
                "seconds_per_step": round(step_s, 4),
                "seconds_per_evaluation": round(self.eval_seconds, 2),
                "planned_at_step": state.global_step,
                "capped_by_max_steps": self.total == self.cap,
            }
            if state.is_world_process_zero:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps(self.planned, indent=1) + "\n")
            note(
                "pretrain",
                f"budget {self.budget_s / 60:g} min: {step_s:.3f} s per step, {self.eval_seconds:.1f} s per evaluation "
                f"-> {self.total} steps{' (max_steps caps it)' if self.total == self.cap else ''}",
            )
            if state.global_step >= self.total:
                control.should_training_stop = True


def budget_schedule(pc: PretrainConfig, plan: BudgetPlan, optimizer: Any) -> Any:
    """The LR schedule of ``pc.lr_schedule`` over ``plan.total`` steps, read at every step (it changes once, when
    the plan is made during warmup): linear warmup, then linear or cosine decay to 0 at the planned end."""
    from torch.optim.lr_scheduler import LambdaLR

    def factor(step: int) -> float:
        if step < pc.warmup_steps:
            return step / max(pc.warmup_steps, 1)
        progress = min((step - pc.warmup_steps) / max(plan.total - pc.warmup_steps, 1), 1.0)
        return 1.0 - progress if pc.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def budget_report(
    pc: PretrainConfig, plan: BudgetPlan | None, seconds: float, tokens: int, blocks: int, block_len: int
) -> dict[str, Any]:
    """The time budget's part of reports/pretrain.json (none without a budget): minutes asked and used, the plan,
    epochs of the training blocks seen (tokens seen / (blocks x block length), padding aside)."""
    if plan is None:
        return {}
    return {
        "budget": {
            "minutes_asked": pc.budget_minutes,
            "plan": plan.planned,
            "epochs": round(tokens / max(blocks * block_len, 1), 3),
        },
        "budget_minutes_used_s": round(seconds, 1),  # the measured half: seconds of training this session
    }


def budget_plan(pc: PretrainConfig, paths: Paths, resume: Path | None, eval_seconds: float) -> BudgetPlan | None:
    """The wall-clock budget's plan (``pretrain.budget_minutes``), or ``None`` for a fixed step count."""
    plan_path = paths.pretrain_checkpoints / BUDGET_PLAN
    if int(os.environ.get("RANK", "0")) == 0 and not resume and plan_path.exists():
        plan_path.unlink()  # a fresh run plans anew (checkpoints of another configuration were set aside)
    if not pc.budget_minutes:
        return None
    return BudgetPlan(pc.budget_minutes, pc.max_steps, pc.eval_steps, eval_seconds, plan_path)
