"""The HF Trainer of pretraining: dynamic masking (:mod:`pipeline.modelling.masking`), perplexity in its evaluation
logs, the block stream's position in every checkpoint, the NaN guard and curves, and the warm-up timer.
"""

from __future__ import annotations

import math
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.paths import Paths
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.modelling.precision import Precision
from pipeline.training.arguments import training_arguments
from pipeline.training.callbacks import (
    TRAIN_SERIES,
    CurveLogger,
    Series,
    TrainingProgress,
    replace_printer,
)
from pipeline.training.master_weights import MasterWeightsTrainer
from pipeline.training.pretraining.blocks import Blocks
from pipeline.training.pretraining.budget import NO_STEP_CAP, BudgetPlan, WarmupTimer, budget_schedule
from pipeline.training.pretraining.evaluation import MAX_LOG_PERPLEXITY, held_out_scores
from pipeline.training.stream import STREAM_STATE, BlockStream, read_stream_state, write_stream_state


class StreamRecorder(TrainerCallback):
    """Writes into each checkpoint where the block stream stands (:func:`~pipeline.training.stream.write_stream_state`)."""

    def __init__(self, stream: BlockStream, batches_per_step: int) -> None:
        self.stream, self.batches_per_step = stream, batches_per_step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            write_stream_state(folder, self.stream, state.global_step * self.batches_per_step)


class PretrainTrainer(MasterWeightsTrainer):
    """The HF Trainer with held-out perplexity and real tokens/s in its logs, the budget's LR schedule, and
    head warm-up (the first ``pc.head_warmup_steps`` steps train the MLM head alone); in bf16 on a CPU the model
    trains in bf16 with fp32 master weights (``Precision.bf16_weights``)."""

    def __init__(
        self,
        *,
        pc: PretrainConfig,
        plan: BudgetPlan | None,
        precision: Precision,
        stream: BlockStream,
        **trainer_kwargs: Any,
    ) -> None:
        self.pc, self.plan, self.precision, self.stream = pc, plan, precision, stream
        self.bf16_weights = precision.bf16_weights(pc.gradient_accumulation_steps)
        self._last = (0.0, 0)  # (time, tokens seen) at the last log line
        super().__init__(**trainer_kwargs)

    def get_train_dataloader(self) -> Any:
        """The train blocks in the order of :attr:`stream` (a batch sampler; accelerate deals its batches to ranks)."""
        from torch.utils.data import DataLoader

        loader = DataLoader(
            self.train_dataset,
            batch_sampler=self.stream,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def resume_stream(self, checkpoint: Path, global_step: int) -> None:
        """Start the stream where ``checkpoint`` left it: in constant time, at the batch after its ``global_step``
        optimiser steps (the Trainer skips no batch itself: ``ignore_data_skip``)."""
        done = global_step * self.args.gradient_accumulation_steps * self.args.world_size
        recorded = read_stream_state(checkpoint) or {}  # a checkpoint killed before its stream.json: nothing to check
        here = self.stream.point(done * self.stream.batch)
        expected = (here.position, self.stream.seed)
        if recorded and (recorded.get("position"), recorded.get("seed")) != expected:
            raise DataError(
                checkpoint / STREAM_STATE,
                None,
                "stale-checkpoint",
                f"it records the stream at row {recorded.get('position')} (seed {recorded.get('seed')}), this run "
                f"would resume at row {here.position} (seed {self.stream.seed}): delete {checkpoint} to resume from "
                "an older checkpoint",
            )
        self.stream.start = done

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "eval_loss" in logs:
            logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], MAX_LOG_PERPLEXITY))
        if "loss" in logs:
            now, seen = time.perf_counter(), int(self.state.num_input_tokens_seen)
            t0, s0 = self._last
            if t0:
                logs["tokens_per_s"] = round((seen - s0) / max(now - t0, 1e-9))
            self._last = (now, seen)
        super().log(logs, *args, **kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        if self.plan is None:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            self.lr_scheduler = budget_schedule(
                self.pc, self.plan, optimizer if optimizer is not None else self.optimizer
            )
        return self.lr_scheduler

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        warming = self.state.global_step < self.pc.head_warmup_steps
        if self.args.world_size == 1:
            self.freeze_encoder(warming)
            return super().training_step(model, inputs, num_items_in_batch)
        # DDP reduces the gradients of the parameters that needed one when it was built: they keep needing one,
        # and the encoder's are dropped after the backward instead (before clipping and the optimiser step)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if warming:
            for param in self.model.bert.parameters():
                param.grad = None
        return loss

    def freeze_encoder(self, frozen: bool) -> None:
        """Head warm-up: while ``frozen`` the encoder's parameters (the word embeddings, which the MLM decoder
        shares, among them) need no gradient, so autograd records nothing through the encoder and a head-only step
        costs its forward pass and the head's backward; they have no gradient, so the optimiser leaves them be.
        The optimiser was built with every parameter (it is created before the first step), so unfreezing them
        needs no new one."""
        if getattr(self, "_encoder_frozen", False) == frozen:
            return
        for param in self.model.bert.parameters():
            param.requires_grad_(not frozen)
            if frozen:
                param.grad = None
        self._encoder_frozen = frozen


class ElectraTrainer(PretrainTrainer):
    """:class:`PretrainTrainer` for :class:`~pipeline.modelling.electra.ElectraPretraining`: its evaluation scores
    the generator's perplexity and the discriminator's accuracy/AUC (:func:`held_out_scores`), and its checkpoints
    hold the shared embeddings once."""

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> Any:
        start = time.perf_counter()
        pad_id = self.processing_class.pad_token_id
        scores = held_out_scores(self.model, list(self.eval_dataset), pad_id, self.precision, self.pc)
        assert scores.rtd is not None  # an ElectraPretraining model always gets detection scores
        metrics = {
            f"{metric_key_prefix}_loss": math.log(scores.perplexity),
            f"{metric_key_prefix}_rtd_accuracy": scores.rtd["accuracy"],
            f"{metric_key_prefix}_rtd_auc": scores.rtd["auc"],
            f"{metric_key_prefix}_runtime": round(time.perf_counter() - start, 3),
        }
        self.model.train()
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        from pipeline.modelling.electra import unique_state_dict

        with self.fp32_weights():  # the state dict of the fp32 masters where the model trains in bf16
            super()._save(output_dir, state_dict=unique_state_dict(self.model))


def make_trainer(  # noqa: PLR0913
    cfg: Config,
    paths: Paths,
    model: Any,
    tok: Any,
    blocks: Blocks,
    eval_items: list[dict[str, Any]],
    precision: Precision,
    similar: Any = None,
    plan: BudgetPlan | None = None,
) -> Any:
    """An HF Trainer with our collator, NaN guard, curve logger, warm-up timer and perplexity in the eval logs.

    The loss comes from the model (:mod:`pipeline.modelling.mlm`: masked-only head, fp32 cross-entropy);
    bf16 is the Trainer's autocast (fp32 weights and optimiser state), or on a CPU the model in bf16 with fp32
    master weights in the optimiser (:mod:`pipeline.training.master_weights`).
    """
    from pipeline.modelling.electra import RtdCollator
    from pipeline.modelling.masking import MaskingCollator, SentencePairCollator

    pc = cfg.pretrain
    cuda = precision.device == "cuda"
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    # fused AdamW on CPU too: faster than the Trainer's default for-loop AdamW, same update (BENCHMARKS.md)
    args = training_arguments(
        output_dir=str(paths.pretrain_checkpoints),
        max_steps=pc.max_steps,
        batch_size=pc.micro_batch_size,
        learning_rate=pc.learning_rate,
        weight_decay=pc.weight_decay,
        warmup=pc.warmup_steps,  # a step count
        lr_schedule=pc.lr_schedule,
        max_grad_norm=pc.max_grad_norm,
        logging_steps=pc.logging_steps,
        eval_steps=pc.eval_steps,
        save_steps=pc.save_steps,
        save_total_limit=pc.save_total_limit,
        seed=cfg.seed,
        precision=precision,
        bf16_autocast=precision.bf16 and not precision.bf16_weights(pc.gradient_accumulation_steps),
        per_device_eval_batch_size=pc.micro_batch_size * 2,
        gradient_accumulation_steps=pc.gradient_accumulation_steps,
        optim="adamw_torch_fused",
        ignore_data_skip=True,  # a resumed run's stream starts at its position (resume_stream), nothing is replayed
        torch_compile=pc.torch_compile,
        include_num_input_tokens_seen="non_padding",
        ddp_backend="gloo" if distributed and not cuda else None,
    )
    common = {
        "mlm_probability": pc.mlm_probability,
        "mask_replace_prob": pc.mask_replace_prob,
        "random_replace_prob": pc.random_replace_prob,
        "batch_seed": cfg.seed,
    }
    if pc.sentence_objective == "none":
        collator = (RtdCollator if pc.objective == "electra" else MaskingCollator)(
            tok,
            masking=pc.masking,
            span_geometric_p=pc.span_geometric_p,
            span_max_words=pc.span_max_words,
            ngram_probs=pc.ngram_probs,
            similar=similar,
            **common,
        )
    else:
        collator = SentencePairCollator(tok, pc.sentence_objective, **common)
    curves = paths.pretrain_curves_in_progress  # copied to reports/pretrain by the stage's commit
    world = int(os.environ.get("WORLD_SIZE", "1"))
    batches_per_step = pc.gradient_accumulation_steps * world  # global batches of micro_batch_size blocks
    stream = BlockStream(
        blocks.shard_sizes,
        pc.micro_batch_size,
        pc.max_steps * batches_per_step,
        cfg.seed,
        partial(setattr, collator, "epoch"),
    )

    electra = pc.objective == "electra"
    eval_columns = ("eval_loss", "eval_perplexity", *(("eval_rtd_accuracy", "eval_rtd_auc") if electra else ()))
    curve_logger = CurveLogger(curves, (TRAIN_SERIES, Series("eval", eval_columns)))

    trainer = (ElectraTrainer if electra else PretrainTrainer)(
        pc=pc,
        plan=plan,
        precision=precision,
        stream=stream,
        model=model,
        args=args,
        train_dataset=blocks.train,
        eval_dataset=eval_items,
        data_collator=collator,
        processing_class=tok,
        callbacks=[StreamRecorder(stream, batches_per_step), curve_logger, WarmupTimer(), *([plan] if plan else [])],
    )
    global_batch = pc.micro_batch_size * pc.gradient_accumulation_steps * world  # blocks per optimiser step
    budget = f"{pc.budget_minutes:g} minutes (at most {pc.max_steps} steps)" if plan else f"{pc.max_steps} steps"
    if plan and pc.max_steps >= NO_STEP_CAP:  # an adaptation arm: the minutes alone end it
        budget = f"{pc.budget_minutes:g} minutes"
    evaluations = f"every {pc.eval_steps} steps" if pc.eval_steps < pc.max_steps else "before and after"
    title = (
        f"{'ELECTRA (replaced-token detection)' if electra else 'masked-LM'} training of {pc.base_model} for {budget} "
        f"of {global_batch} blocks x {blocks.block_len} tokens "
        f"({precision.name}, {pc.masking} masking{', similar words for [MASK]' if similar is not None else ''}), "
        f"held-out perplexity {evaluations}"
    )
    replace_printer(trainer, TrainingProgress("pretrain", title, ("tokens", global_batch * blocks.block_len)))
    return trainer
