"""Training a multi-task model with the HF Trainer: what finetune and compress (distillation, recovery) share.

A :class:`TrainJob` names the model, its tokenized tasks, where its checkpoints and curves go and
its step budget; :func:`train` runs it (or resumes it from a checkpoint with the same
fingerprint) on single-task batches (:mod:`pipeline.training.multitask`): task sampling, per-task
loss weights, layer-wise LR decay, warmup then decay, gradient clipping, dev evaluation every
``finetune.eval_steps`` with early stopping on the mean of the tasks' primary dev metrics, and the
best checkpoint restored at the end. ``compute_loss`` swaps the loss (distillation's soft targets).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import Trainer

from pipeline.core.errors import DataError
from pipeline.core.io import naming_writes
from pipeline.core.sections.finetune import FinetuneConfig
from pipeline.modelling.dropout import training_kernels
from pipeline.modelling.precision import Precision
from pipeline.tracking.runs import nested_run
from pipeline.training.adversarial import Adversarial
from pipeline.training.arguments import training_arguments
from pipeline.training.callbacks import (
    TRAIN_SERIES,
    CurveLogger,
    Series,
    TrainingProgress,
    frozen_heap,
    replace_printer,
)
from pipeline.training.checkpoints import (
    keep_curves_until,
    prepare_checkpoints,
    restore_weights,
    step_of,
    weights_layout,
)

if TYPE_CHECKING:
    from pipeline.training.multitask import StepPlan

LossFn = Callable[[Any, dict[str, Any]], dict[str, Any]]  # (model, batch) -> outputs with "loss"


@dataclass
class TrainJob:
    """One multi-task model to train: the model, its tasks, where checkpoints and curves go, its budget."""

    name: str  # adapted | baseline | single-<task> | distilled | pruned: checkpoint dir and log prefix
    run_name: str  # the nested MLflow run the Trainer logs into
    model: Any
    tokenizer: Any
    tasks: dict[str, Any]
    checkpoints: Path
    curves: Path
    max_steps: int
    learning_rate: float
    compute_loss: LossFn | None = None  # None: the model's own loss (gold labels)
    adversarial: Adversarial | None = None  # FGM/PGD on the word embeddings (finetune.adversarial)
    stage: str = "finetune"  # the stage that trains it: console prefix
    callbacks: tuple[Any, ...] = ()  # more TrainerCallbacks (the search's dev pruning)
    run_params: dict[str, str] = field(default_factory=dict)  # logged on its MLflow run (a search trial's values)


def check_resume_heads(ckpt: Path, specs: list[Any]) -> None:
    """A checkpoint whose heads do not fit the current label maps cannot be resumed: say so."""
    from safetensors import safe_open

    from pipeline.training.multitask import head_shapes_problem

    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("heads.")}  # noqa: SIM118 (safe_open is not iterable)
    problem = head_shapes_problem(shapes, specs)
    if problem:
        raise DataError(
            ckpt / "model.safetensors",
            None,
            "head-mismatch",
            f"cannot resume from {ckpt.name}: {problem}. Delete {ckpt.parent} to start fresh, or restore the labels",
        )


def dev_scores(
    model: Any, tasks: dict[str, Any], pad_id: int, batch_size: int, precision: Precision
) -> dict[str, float]:
    """``mean_primary`` and ``<task>_<metric>`` on the validation splits (what early stopping watches)."""
    from pipeline.training.multitask import mean_primary, score_task

    out: dict[str, float] = {}
    primaries = {}
    for name, data in tasks.items():
        scored = score_task(model, data, "validation", pad_id, batch_size, precision)
        primaries[name] = scored.primary(data.spec)
        out[f"{name}_{data.spec.primary}"] = round(primaries[name], 5)
    out["mean_primary"] = round(mean_primary(primaries), 5)
    return out


def curve_series(tasks: dict[str, Any]) -> tuple[Series, ...]:
    """``train.csv`` (loss, learning rate, gradient norm) and ``dev.csv`` (mean and per-task primary metric)."""
    dev = ("eval_mean_primary", *(f"eval_{n}_{d.spec.primary}" for n, d in tasks.items()))
    return TRAIN_SERIES, Series("dev", dev)


class MultiTaskTrainer(Trainer):
    """The HF Trainer over single-task batches: our batch sampler, each task's loss, adversarial steps, and
    dev evaluation that scores every task the way evaluate does (its mean primary metric picks the best)."""

    def __init__(  # the Trainer's own arguments pass through **trainer_kwargs
        self,
        *,
        tasks: dict[str, Any],
        batch_sampler: Any,
        loss_fn: LossFn | None,
        adversarial: Adversarial | None,
        pad_id: int,
        eval_batch_size: int,
        precision: Precision,
        **trainer_kwargs: Any,
    ) -> None:
        self.tasks, self.batch_sampler, self.loss_fn, self.adversarial = tasks, batch_sampler, loss_fn, adversarial
        self.pad_id, self.eval_batch_size, self.precision = pad_id, eval_batch_size, precision
        self._adv_losses: tuple[float, ...] = ()  # adversarial losses since the last log line
        super().__init__(**trainer_kwargs)

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        loss = super().training_step(model, inputs, num_items_in_batch)  # the clean forward and backward
        if self.adversarial is not None:
            # same batch, perturbed embeddings, the Trainer's autocast; gradients add onto the clean ones
            # (no gradient accumulation or fp16 scaler here: finetune steps on one batch, bf16 needs none)
            prepared = self._prepare_inputs(inputs)

            def perturbed_loss() -> Any:
                with self.compute_loss_context_manager():
                    return self.compute_loss(model, prepared, num_items_in_batch=num_items_in_batch)

            adv_loss = self.adversarial.backward(model, perturbed_loss)["adv_loss"]
            if adv_loss is not None:
                self._adv_losses = (*self._adv_losses, adv_loss)
        return loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs and self._adv_losses:
            logs["adv_loss"] = round(sum(self._adv_losses) / len(self._adv_losses), 4)
            self._adv_losses = ()
        super().log(logs, *args, **kwargs)

    def get_train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(
            self.train_dataset, batch_sampler=self.batch_sampler, collate_fn=self.data_collator, num_workers=0
        )

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        out = self.loss_fn(model, inputs) if self.loss_fn else model(**inputs)
        return (out["loss"], out) if return_outputs else out["loss"]

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        scores = dev_scores(self.model, self.tasks, self.pad_id, self.eval_batch_size, self.precision)
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in scores.items()}
        self.model.train()
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def step_plan(fc: FinetuneConfig, tasks: dict[str, Any], max_steps: int) -> StepPlan:
    """The run's step budget (at most ``max_steps``) and task shares: ``finetune.epochs`` per task, or
    ``max_steps`` shared by ``finetune.sampling`` (:func:`pipeline.training.multitask.plan_steps`)."""
    from pipeline.training.multitask import plan_steps

    return plan_steps(
        {n: len(d.splits["train"]) for n, d in tasks.items()},
        fc.batch_size,
        max_steps,
        fc.task_epochs(list(tasks)),
        fc.sampling,
        fc.temperature,
        {n: d.spec.settings.sampling_weight for n, d in tasks.items()},
    )


def make_trainer(fc: FinetuneConfig, seed: int, job: TrainJob, precision: Precision) -> Any:
    """An HF Trainer over single-task batches, with the LLRD optimiser, dev metrics and early stopping;
    ``precision`` bf16 is the Trainer's autocast (fp32 weights, optimiser state and losses)."""
    from transformers import EarlyStoppingCallback

    from pipeline.training.multitask import MultiTaskBatchSampler, MultiTaskDataset, llrd_param_groups, make_collate

    tasks = job.tasks
    pad_id = job.tokenizer.pad_token_id
    args = training_arguments(
        output_dir=str(job.checkpoints),
        max_steps=job.max_steps,
        batch_size=fc.batch_size,
        learning_rate=job.learning_rate,
        weight_decay=fc.weight_decay,
        warmup=fc.warmup_ratio,  # a share of max_steps (< 1)
        lr_schedule=fc.lr_schedule,
        max_grad_norm=fc.max_grad_norm,
        logging_steps=fc.logging_steps,
        eval_steps=fc.eval_steps,
        save_steps=fc.eval_steps,  # a checkpoint per evaluation: the best one is loaded at the end
        save_total_limit=fc.save_total_limit,
        seed=seed,
        precision=precision,
        bf16_autocast=precision.bf16,
        run_name=job.run_name,
        load_best_model_at_end=True,
        metric_for_best_model="mean_primary",
        greater_is_better=True,
    )
    # the task shares of the run's budget; the budget itself is the job's (a same-compute baseline's extra steps,
    # a distillation's own max_steps): the shares carry over to it
    plan = replace(step_plan(fc, tasks, job.max_steps), max_steps=job.max_steps)
    sizes = plan.sizes
    steps_per_epoch = max(1, math.ceil(sum(sizes.values()) / fc.batch_size))
    sampler = MultiTaskBatchSampler(
        {n: d.lengths("train") for n, d in tasks.items()},
        plan.probs,
        fc.batch_size,
        fc.bucket_batches,
        steps_per_epoch,
        seed,
    )
    collate = make_collate({n: d.spec for n, d in tasks.items()}, pad_id)
    optimizer = torch.optim.AdamW(
        llrd_param_groups(job.model, job.learning_rate, fc.layer_lr_decay, fc.weight_decay),
        lr=job.learning_rate,
        fused=True,
    )  # CPU too: faster than the for-loop default (docs/speed.md)
    curve_logger = CurveLogger(job.curves, curve_series(tasks), who=job.name)
    adversarial = job.adversarial

    trainer = MultiTaskTrainer(
        tasks=tasks,
        batch_sampler=sampler,
        loss_fn=job.compute_loss,
        adversarial=job.adversarial,
        pad_id=pad_id,
        eval_batch_size=fc.eval_batch_size,
        precision=precision,
        model=job.model,
        args=args,
        train_dataset=MultiTaskDataset(tasks),
        eval_dataset={n: d.splits["validation"] for n, d in tasks.items()},
        data_collator=collate,
        processing_class=job.tokenizer,
        optimizers=(optimizer, None),
        callbacks=[
            curve_logger,
            EarlyStoppingCallback(fc.early_stopping_patience, fc.early_stopping_threshold),
            *job.callbacks,
        ],
    )
    title = (
        f"training the {job.name} model on {', '.join(tasks)}: up to {job.max_steps} steps of {fc.batch_size} examples "
        f"({plan.describe()}) "
        f"in {precision.name}{', adversarial ' + adversarial.describe() if adversarial else ''}, dev every "
        f"{fc.eval_steps} steps, early stop after {fc.early_stopping_patience} evaluations without gain"
    )
    replace_printer(trainer, TrainingProgress(job.stage, title, ("examples", fc.batch_size), who=job.name))
    trainer.step_plan = plan
    return trainer


def train(
    fc: FinetuneConfig, seed: int, job: TrainJob, precision: Precision, run_fingerprint: str, log_prefix: str
) -> tuple[Any, dict[str, Any]]:
    """Train ``job`` (or resume it from a checkpoint with ``run_fingerprint``); the best model and a summary."""
    log: list[str] = []
    # the heads' shapes are compared by check_resume_heads, which names a changed label count
    layout = weights_layout(job.model, shapes_elsewhere=("heads.",))
    resume = prepare_checkpoints(job.checkpoints, run_fingerprint, log, {"precision": precision.name}, layout)
    if resume:
        check_resume_heads(resume, [d.spec for d in job.tasks.values()])
    for line in log:
        print(f"{log_prefix} ({job.name}): {line}", file=sys.stderr)
    keep_curves_until(job.curves, step_of(resume) if resume else 0)
    state = json.loads((resume / "trainer_state.json").read_text()) if resume else {}
    with nested_run(job.run_name, job.run_params):  # the Trainer's MLflow callback logs into it
        trainer = make_trainer(fc, seed, job, precision)
        start = time.perf_counter()
        fit(trainer, resume, state, job.checkpoints, job.max_steps)
        seconds = time.perf_counter() - start
    examples = (trainer.state.global_step - int(state.get("global_step", 0))) * fc.batch_size
    best_step = (
        step_of(Path(trainer.state.best_model_checkpoint))
        if trainer.state.best_model_checkpoint
        else trainer.state.global_step
    )
    summary = {
        "resumed_from": resume.name if resume else None,
        "checkpoint_log": log,
        "steps": trainer.state.global_step,
        "best_step": best_step,
        "stopped_early": trainer.state.global_step < job.max_steps,
        "best_dev_mean_primary": trainer.state.best_metric,
        "planned_epochs": {t: round(e, 2) for t, e in trainer.step_plan.epochs.items()},  # per task, in max_steps
        "train_seconds": round(seconds, 1),
        "train_examples_per_s": round(examples / max(seconds, 1e-9), 1)
        if examples
        else None,  # None: nothing left to train
    }
    # Accelerate wraps forward in a bf16 autocast for mixed precision; unwrapped, the model runs in whatever
    # precision its caller asks for (an INT8 copy of it must never see bf16 activations)
    model = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    return model.eval(), summary


def fit(trainer: Any, resume: Path | None, state: dict[str, Any], ckpt_dir: Path, max_steps: int) -> None:
    """Train from scratch or from ``resume``; a run that had already finished only restores its best weights."""
    stopped = state.get("stateful_callbacks", {}).get("TrainerControl", {}).get("args", {}).get("should_training_stop")
    if resume and (state["global_step"] >= max_steps or stopped):
        # training had finished (max_steps, or early stopping) before the stage died or was re-run: take the best
        # weights, train no further (was: a run that had stopped early trained on past its stop, another model)
        best = Path(state.get("best_model_checkpoint") or resume)
        restore_weights(trainer.model, ckpt_dir / best.name)
        trainer.state.global_step, trainer.state.best_metric = state["global_step"], state.get("best_metric")
        trainer.state.best_model_checkpoint = str(ckpt_dir / best.name)
    else:
        with (
            naming_writes(lambda: f"writing checkpoints under {trainer.args.output_dir}"),
            frozen_heap(),
            training_kernels(trainer.model, trainer.precision),
        ):
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
