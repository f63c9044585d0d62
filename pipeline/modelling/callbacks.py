"""Trainer callbacks shared by pretrain and finetune: the curve logger with its non-finite loss guard."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from pipeline.core.errors import NonFiniteLoss


class CurveLogger(TrainerCallback):
    """Stops training on a non-finite loss (before the next checkpoint) and appends the DVC plot rows.

    ``columns`` are the CSV header (``step`` first, then log keys); a row is written for every log
    that holds one of ``triggers`` (train loss, evaluation), by the main process only.
    """

    def __init__(self, path: Path, columns: list[str], triggers: tuple[str, ...], who: str = "") -> None:
        self.path, self.columns, self.triggers, self.who = path, columns, triggers, who

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        if "loss" in logs and not math.isfinite(logs["loss"]):
            prefix = f"{self.who}: " if self.who else ""
            raise NonFiniteLoss(
                f"{prefix}non-finite training loss {logs['loss']} at step {state.global_step}; "
                f"the last good checkpoint is kept in {args.output_dir}"
            )
        if state.is_world_process_zero and any(key in logs for key in self.triggers):
            new = not self.path.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", newline="") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(self.columns)
                writer.writerow([state.global_step] + [logs.get(key, "") for key in self.columns[1:]])
