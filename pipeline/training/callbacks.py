"""Trainer callbacks shared by pretrain and finetune: the curve logger with its non-finite loss guard, progress, and
the frozen heap a training runs in."""

from __future__ import annotations

import csv
import gc
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from pipeline.core.errors import NonFiniteLoss


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Run a training with the objects alive before it (imported modules, the data) out of the garbage collector's
    sweeps, unfrozen afterwards. ``Trainer.train`` starts with Accelerate's ``free_memory``, a full ``gc.collect()``
    that walks every object of torch, transformers and MLflow: 0.34 s per training with the stage's modules loaded
    on the 2-core EPYC, more in a process that trained before (a study's dozens of fine-tunings, the tests)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(frozen=True)
class Series:
    """One DVC plot file: ``<curves dir>/<name>.csv`` with ``step`` and ``columns``, a row per log that has them all.

    A file holds one kind of log only (training or evaluation), so no cell is ever empty: DVC's Vega
    plots draw an empty cell as 0, which turned the old mixed file into a saw-tooth.
    """

    name: str
    columns: tuple[str, ...]

    def row(self, step: int, logs: dict[str, float]) -> list[Any] | None:
        if not all(key in logs for key in self.columns):
            return None
        return [step, *(logs[key] for key in self.columns)]


TRAIN_SERIES = Series("train", ("loss", "learning_rate", "grad_norm"))


class CurveLogger(TrainerCallback):
    """Stops training on a non-finite loss (before the next checkpoint) and appends the DVC plot rows.

    Each of ``series`` is its own CSV under ``directory``, written by the main process only.
    """

    def __init__(self, directory: Path, series: tuple[Series, ...], who: str = "") -> None:
        self.directory, self.series, self.who = directory, series, who

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" in logs and not math.isfinite(logs["loss"]):
            prefix = f"{self.who}: " if self.who else ""
            raise NonFiniteLoss(
                f"{prefix}non-finite training loss {logs['loss']} at step {state.global_step}; "
                f"the last good checkpoint is kept in {args.output_dir}"
            )
        if not state.is_world_process_zero:
            return
        for series in self.series:
            row = series.row(state.global_step, logs)
            if row is not None:
                append_row(self.directory / f"{series.name}.csv", ["step", *series.columns], row)


def append_row(path: Path, header: list[str], row: list[Any]) -> None:
    """Append ``row`` to the CSV at ``path``, writing ``header`` first when the file is new."""
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(header)
        writer.writerow(row)


class TrainingProgress(TrainerCallback):
    """Step/total, loss, throughput and ETA of a training run (:class:`pipeline.core.console.Progress`).

    Replaces the Trainer's own printer (a Python dict per log). ``title`` is the header printed when
    training starts (which model, what it trains for); a plain line is printed at every training log
    step, an evaluation as its own line. ``per_step``: the throughput shown besides steps/s (``("tokens",
    2048)``: tokens in one optimiser step). ``who``: the model the lines are about, where a stage trains several
    (``compress (distilled):  5/10 steps``).
    """

    def __init__(self, stage: str, title: str, per_step: tuple[str, int] | None = None, who: str = "") -> None:
        self.stage, self.title, self.per_step = stage, title, per_step
        self.label = f"{stage} ({who}):" if who else f"{stage}:"
        self.progress: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from pipeline.core.console import Progress

        if not state.is_world_process_zero:
            return
        print(f"{self.stage}: {self.title}", file=sys.stderr, flush=True)
        # plain logs get a line per logging step only (on_log), never one in between
        self.progress = Progress(self.label, state.max_steps, "steps", every_s=float("inf"))
        self.progress.update(state.global_step)

    def throughput(self) -> dict[str, Any]:
        rate = self.progress.rate()
        if rate is None or self.per_step is None:
            return {}
        name, per = self.per_step
        return {f"{name}/s": round(rate * per)}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.total = state.max_steps  # a time budget plans the step count after the first steps
            self.progress.update(state.global_step, **self.throughput())

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if self.progress is None or not logs:
            return
        if "loss" in logs:
            self.progress.update(state.global_step, line=True, loss=round(float(logs["loss"]), 4), **self.throughput())
        shown = {
            k.removeprefix("eval_"): v
            for k, v in logs.items()
            if k.startswith("eval_") and not k.endswith(("runtime", "_per_second", "_samples", "_steps"))
        }
        if shown:
            ordered = sorted(shown.items(), key=lambda kv: kv[0] != "mean_primary")[:8]  # the headline first
            text = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in ordered)
            self.progress.say(f"{self.label} step {state.global_step}/{state.max_steps} evaluation: {text}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None


def replace_printer(trainer: Any, progress: TrainingProgress) -> None:
    """Swap the Trainer's dict printer (and tqdm bar, if any) for ``progress``."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(progress)
