"""params.yaml ``finetune``: multi-task fine-tuning, with per-task settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.sections.base import Strict


class FinetuneTaskConfig(Strict):
    """Per-task fine-tuning settings; a task not listed under ``finetune.tasks`` gets these defaults."""

    pooling: Literal["cls", "mean"] = "cls"
    loss_weight: float = Field(default=1.0, gt=0)
    class_weights: Literal["none", "balanced"] = "none"
    metric: str | None = None
    sampling_weight: float = Field(default=1.0, gt=0)
    n_best: int = Field(default=20, ge=1)
    max_answer_tokens: int = Field(default=30, ge=1)
    long_text: Literal["truncate", "windows"] = "truncate"
    window_aggregation: Literal["mean", "max"] = "mean"
    max_windows: int = Field(default=8, ge=1, le=64)
    epochs: float | None = Field(default=None, gt=0)  # passes over this task's train examples (finetune.epochs)
    # token classification: viterbi: the most probable tag sequence that is valid IOB2; argmax: each word's own best
    decoding: Literal["viterbi", "argmax"] = "viterbi"


class FinetuneConfig(Strict):
    baseline: bool
    baseline_budget: Literal["same_steps", "same_compute"] = "same_steps"  # the baseline's fine-tuning budget
    single_task: bool
    side_by_side: Literal["auto", "always", "never"] = "auto"  # adapted and baseline at once, a process each (CPU)
    max_steps: int = Field(ge=1)
    epochs: float | None = Field(default=None, gt=0)  # passes per task (tasks.<name>.epochs overrides); null: max_steps
    batch_size: int = Field(ge=1)
    eval_batch_size: int = Field(ge=1)
    learning_rate: float = Field(gt=0)
    layer_lr_decay: float = Field(gt=0, le=1)
    weight_decay: float = Field(ge=0)
    warmup_ratio: float = Field(ge=0, lt=1)
    lr_schedule: Literal["linear", "cosine"]
    max_grad_norm: float = Field(gt=0)
    dropout: float = Field(ge=0, lt=1)
    sampling: Literal["proportional", "temperature", "fixed"]
    temperature: float = Field(gt=0)
    bucket_batches: int = Field(ge=1)
    eval_steps: int = Field(ge=1)
    early_stopping_patience: int = Field(ge=1)
    early_stopping_threshold: float = Field(ge=0)
    logging_steps: int = Field(ge=1)
    save_total_limit: int = Field(ge=1)
    adversarial: Literal["none", "fgm", "pgd"] = "none"
    adversarial_epsilon: float = Field(default=1.0, gt=0)
    adversarial_steps: int = Field(default=3, ge=1)
    adversarial_alpha: float | None = Field(default=None, gt=0)
    tasks: dict[str, FinetuneTaskConfig] = Field(default_factory=dict)

    def task(self, name: str) -> FinetuneTaskConfig:
        """Settings of task ``name`` (the defaults when it is not listed)."""
        return self.tasks.get(name, FinetuneTaskConfig())

    def task_epochs(self, names: list[str]) -> dict[str, float] | None:
        """Each task's epochs budget (its own ``epochs``, else ``finetune.epochs``), or None: a step budget."""
        own = {n: self.task(n).epochs for n in names}
        if self.epochs is None and all(e is None for e in own.values()):
            return None
        if self.epochs is None:
            missing = [n for n, e in own.items() if e is None]
            raise ValueError(
                f"finetune.tasks.<name>.epochs is set for some tasks but not for {missing}, and finetune.epochs is "
                "null: set finetune.epochs (the default of every task) or each task's epochs"
            )
        return {n: e if e is not None else self.epochs for n, e in own.items()}
