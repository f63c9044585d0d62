"""Continued masked-LM pretraining, the library half of the pretrain stage: the model (offline MiniLM, a
local BERT, a hub id or a scratch ``BertConfig``) with its new-token rows initialised as the mean of their
base pieces, the fixed evaluation masks and perplexity, the resume fingerprint, the HF Trainer with dynamic
masking (:mod:`pipeline.modelling.masking`), the warm-up timer and the wall-clock budget plan, and the
``torchrun`` launch of ``pretrain.nproc`` processes. :mod:`pipeline.stages.pretrain` runs it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from pipeline.core.config import Config
from pipeline.core.console import note
from pipeline.core.errors import ConfigError, DataError, WorkersFailed
from pipeline.core.io import missing_input, naming_writes, require_inputs
from pipeline.core.paths import Paths
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.modelling.dropout import training_kernels
from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.modelling.models import check_bert, resolve_base, scratch_bert_config
from pipeline.modelling.precision import Precision
from pipeline.modelling.shards import TASK_TEXT, groups_digest, has_group, open_group
from pipeline.modelling.similar_words import coverage, similar_word_table
from pipeline.tracking.runs import worker_env
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
    fingerprint,
    keep_curves_until,
    prepare_checkpoints,
    restore_weights,
    step_of,
    weights_layout,
)
from pipeline.training.master_weights import MasterWeightsTrainer
from pipeline.training.stream import STREAM_STATE, BlockStream, read_stream_state, write_stream_state

MASKING_BATCH = 64  # held-out blocks masked per collator call (the fixed evaluation masks)
PERPLEXITY_BATCH = 32  # held-out blocks per forward pass when scoring perplexity
MAX_LOG_PERPLEXITY = 50.0  # exp() of a larger loss overflows; perplexities beyond e^50 mean "untrained" anyway

# ----------------------------------------------------------------------------- model


def announce_new_weights(base_model: str, missing: list[str] | set[str]) -> None:
    """Say in one line which heads the base checkpoint lacks (initialised fresh), instead of transformers' load table."""
    heads = sorted({key.split(".")[0] for key in missing})
    if heads:
        what = {"cls": "MLM head"}.get(heads[0], heads[0]) if len(heads) == 1 else ", ".join(heads)
        note("pretrain", f"{base_model} ships no {what}: a new one is initialised ({len(missing)} tensors)")


def build_model(pc: PretrainConfig, tok: Any, tok_dir: Path, block_len: int) -> Any:
    """``BertForMaskedLM`` (``BertForPreTraining`` with a sentence objective) for ``pc.base_model``,
    its vocab matched to the tokenizer; with ``objective: electra`` the generator and discriminator pair."""
    from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM, MaskedOnlyBertForPreTraining

    if pc.objective == "electra":
        return build_electra(pc, tok, tok_dir, block_len)
    # standard BertForMaskedLM / BertForPreTraining (MLM + sentence head) weights, with the MLM head run at masked positions only
    model_cls = MaskedOnlyBertForMaskedLM if pc.sentence_objective == "none" else MaskedOnlyBertForPreTraining
    model = load_masked_lm(pc, model_cls, tok, tok_dir, block_len)
    model.sentence_loss_weight = pc.sentence_loss_weight
    set_dropout(model.bert, pc.attention_dropout, pc.hidden_dropout)
    return model


def build_electra(pc: PretrainConfig, tok: Any, tok_dir: Path, block_len: int) -> Any:
    """ELECTRA's pair (:mod:`pipeline.modelling.electra`): the discriminator is ``pc.base_model``'s encoder, the
    generator a masked LM of its first ``generator_fraction`` of layers (their weights from the base model, its MLM
    head the base model's where it ships one), the embeddings shared."""
    from pipeline.modelling.electra import ElectraPretraining, generator_layers
    from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM

    discriminator = load_masked_lm(pc, MaskedOnlyBertForMaskedLM, tok, tok_dir, block_len, announce=False).bert
    layers = generator_layers(discriminator.config.num_hidden_layers, pc.electra.generator_fraction)
    generator = load_masked_lm(pc, MaskedOnlyBertForMaskedLM, tok, tok_dir, block_len, layers=layers)
    model = ElectraPretraining(discriminator, generator, pc.electra.rtd_weight)
    for encoder in (model.bert, model.generator.bert):
        set_dropout(encoder, pc.attention_dropout, pc.hidden_dropout)
    note(
        "pretrain",
        f"ELECTRA: generator of {layers} of {discriminator.config.num_hidden_layers} layers (embeddings shared), "
        f"discriminator loss weight {pc.electra.rtd_weight:g}",
    )
    return model


def load_masked_lm(
    pc: PretrainConfig,
    model_cls: Any,
    tok: Any,
    tok_dir: Path,
    block_len: int,
    layers: int | None = None,
    announce: bool = True,
) -> Any:
    """``model_cls`` (a masked-only MLM class) from ``pc.base_model`` (or its scratch config), its first ``layers``
    encoder layers only where given, new-token rows initialised, its head set to ``pc.mlm_head``."""
    import torch

    depth = {} if layers is None else {"num_hidden_layers": layers}
    if pc.base_model == "scratch":
        s = pc.scratch
        config = scratch_bert_config(s, len(tok), tok.pad_token_id)
        for key, value in depth.items():
            setattr(config, key, value)
        config._attn_implementation = "sdpa"
        model = model_cls(config)
    else:
        source = resolve_base(pc.base_model, "pretrain.base_model")
        check_bert(source, "pretrain.base_model")
        model, loading = model_cls.from_pretrained(
            source,
            use_safetensors=True,
            attn_implementation="sdpa",
            dtype=torch.float32,
            output_loading_info=True,
            **depth,
        )
        if announce:
            announce_new_weights(pc.base_model, loading["missing_keys"])
    if block_len > model.config.max_position_embeddings:
        raise ConfigError(
            f"blocks of {block_len} tokens exceed the model's max_position_embeddings={model.config.max_position_embeddings}"
        )
    new_tokens_path = tok_dir / "new_tokens.json"
    # a model that already has the tokenizer's rows (one adapted with it, continued) keeps its trained new rows
    if new_tokens_path.exists() and pc.base_model != "scratch" and model.config.vocab_size != len(tok):
        init_new_token_rows(model, len(tok), json.loads(new_tokens_path.read_text(encoding="utf-8")))
    if model.config.vocab_size != len(tok):
        raise DataError(
            tok_dir,
            None,
            "vocab-mismatch",
            f"the tokenizer has {len(tok)} tokens but pretrain.base_model "
            f"'{pc.base_model}' has vocab_size={model.config.vocab_size}",
        )
    model.masked_only = pc.mlm_head == "masked_only"
    return model


def set_dropout(encoder: Any, attention: float | None, hidden: float | None) -> None:
    """Training dropout of the encoder's attention probabilities / hidden states (``None``: the base model's).

    Set on the modules, not the config: the saved model keeps the base model's dropout for fine-tuning.
    """
    from torch import nn

    for name, module in encoder.named_modules():
        if not isinstance(module, nn.Dropout):
            continue
        value = attention if name.endswith("attention.self.dropout") else hidden
        if value is not None:
            module.p = value


def init_new_token_rows(model: Any, vocab_size: int, new_tokens: dict[str, Any]) -> None:
    """Resize to ``vocab_size`` and set each new embedding row to the mean of its base pieces' rows.

    The MLM decoder stays tied to the input embeddings, so it gets the same rows; the decoder
    bias of a new token is the mean of its pieces' biases.
    """
    import torch

    old = model.get_input_embeddings().weight.shape[0]
    if (
        any(info["id"] < old for info in new_tokens.values())
        or max((i["id"] for i in new_tokens.values()), default=-1) >= vocab_size
    ):
        raise DataError(
            "new_tokens.json", None, "vocab-mismatch", f"new token ids do not follow the base vocab of {old} rows"
        )
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    emb = model.get_input_embeddings().weight
    bias = model.cls.predictions.decoder.bias if model.cls.predictions.decoder.bias is not None else None
    with torch.no_grad():
        for info in new_tokens.values():
            pieces = torch.tensor(info["piece_ids"])
            emb[info["id"]] = emb[pieces].mean(dim=0)
            if bias is not None:
                bias[info["id"]] = bias[pieces].mean()
    model.tie_weights()


# ----------------------------------------------------------------------------- evaluation


def fixed_eval_set(tok: Any, pc: PretrainConfig, blocks: Any, similar: Any = None) -> list[dict[str, Any]]:
    """The first ``eval_max_blocks`` validation blocks, masked once with ``eval_seed`` the way training
    masks (``similar``: the similar-word table of ``mask_token: similar``, else [MASK]).

    The same positions are scored at every evaluation, for the base and the adapted model.
    """
    from pipeline.modelling.masking import MaskingCollator

    collator = MaskingCollator(
        tok,
        masking=pc.masking,
        mlm_probability=pc.mlm_probability,
        mask_replace_prob=pc.mask_replace_prob,
        random_replace_prob=pc.random_replace_prob,
        span_geometric_p=pc.span_geometric_p,
        span_max_words=pc.span_max_words,
        ngram_probs=pc.ngram_probs,
        similar=similar,
        seed=pc.eval_seed,
    )
    rows = [blocks[i] for i in range(min(len(blocks), pc.eval_max_blocks))]
    items = []
    for start in range(0, len(rows), MASKING_BATCH):
        batch = collator(rows[start : start + MASKING_BATCH])
        for i in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][i].sum())
            items.append({"input_ids": batch["input_ids"][i, :n], "labels": batch["labels"][i, :n]})
    return items


def masked_perplexity(
    model: Any, items: list[dict[str, Any]], pad_id: int, precision: Precision, batch_size: int = PERPLEXITY_BATCH
) -> float:
    """exp(mean cross-entropy over every masked position of ``items``), token-weighted; the head runs
    where the model's ``masked_only`` says (the loss is the same either way)."""
    import torch

    from pipeline.modelling.masking import pad_masked

    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad(), precision.autocast():
        for start in range(0, len(items), batch_size):
            batch = {k: v.to(device) for k, v in pad_masked(items[start : start + batch_size], pad_id).items()}
            n = int((batch["labels"] != IGNORE_INDEX).sum())
            total += float(model(**batch).loss) * n  # the loss is the fp32 mean over this batch's n masked positions
            count += n
    return math.exp(total / max(count, 1))


def held_out_scores(
    model: Any, items: list[dict[str, Any]], pad_id: int, precision: Precision, pc: PretrainConfig
) -> HeldOut:
    """The held-out scores of ``model`` on the fixed masks: MLM perplexity; for ELECTRA the generator's perplexity
    and the discriminator's accuracy and AUC on replacements sampled with ``pc.eval_seed``."""
    from pipeline.modelling.electra import ElectraPretraining, rtd_scores

    if not isinstance(model, ElectraPretraining):
        return HeldOut(masked_perplexity(model, items, pad_id, precision), None)
    scores = rtd_scores(model, items, pad_id, precision.autocast(), pc.eval_seed, PERPLEXITY_BATCH)
    rtd = {
        "accuracy": round(scores.accuracy, 4),
        "auc": round(scores.auc, 4) if math.isfinite(scores.auc) else None,
        "replaced_share": round(scores.replaced_share, 4),
    }
    return HeldOut(scores.perplexity, rtd)


def run_fingerprint(cfg: Config, paths: Paths, precision: Precision) -> str:
    """What a checkpoint must share with this run to be resumed: params, seed, precision, training code, data and tokenizer."""
    settings = cfg.pretrain.model_dump(mode="json")
    if cfg.pretrain.selection.mode == "all":  # the selection's other settings change nothing then
        settings.pop("selection")
    payload = {"pretrain": settings, "seed": cfg.seed, "precision": precision.name}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    # the blocks by the content hashes tokenize listed (hashing the shards again would take minutes on a large corpus)
    digest.update(groups_digest(paths.pretrain_blocks, train_groups(cfg.pretrain)).encode())
    code = Path(__file__).parent.parent  # a resumed run must not mix two versions of the training code
    data = [paths.tokenizer / "tokenizer.json"]
    if cfg.pretrain.selection.mode == "nearest":
        data.append(paths.selection / "blocks.npy")
    return fingerprint(
        digest,
        [
            code / "stages" / "pretrain.py",
            code / "training" / "pretraining.py",
            code / "training" / "arguments.py",
            code / "modelling" / "masking.py",
            code / "modelling" / "mlm.py",
            code / "modelling" / "electra.py",
            code / "modelling" / "similar_words.py",
            code / "modelling" / "shards.py",
            code / "training" / "stream.py",
            code / "training" / "master_weights.py",
        ],
        data,
    )


# ----------------------------------------------------------------------------- training


def selected_blocks(train: Any, paths: Paths) -> tuple[Any, dict[str, Any]]:
    """The corpus blocks the select stage chose (``data/selection/``), and what the report says of them."""
    import numpy as np

    record_file, blocks_file = paths.selection / "selection.json", paths.selection / "blocks.npy"
    require_inputs(record_file, blocks_file)
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if record.get("mode") != "nearest" or record.get("corpus_blocks") != len(train):
        raise DataError(
            paths.selection,
            None,
            "stale-selection",
            f"it was made for {record.get('corpus_blocks')} blocks in mode {record.get('mode')}, the corpus has "
            f"{len(train)} and pretrain.selection.mode is nearest: run the select stage (dvc repro select)",
        )
    index = np.load(blocks_file)
    shown = {"mode": "nearest", "k": record["k"], "corpus_blocks": len(train), "selected_blocks": len(index)}
    return train.select(index.tolist()), shown


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


NO_STEP_CAP = 1_000_000  # pretrain.max_steps that a budget_minutes run never reaches (the tournament's arms)
BUDGET_CALIBRATION = 8  # optimiser steps timed (after WarmupTimer's warm-up steps) before a budget plans the step count
BUDGET_PLAN = "budget-plan.json"  # in checkpoints/pretrain/: the planned steps, so that a resumed run keeps them


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


def launch_distributed(pc: PretrainConfig) -> None:
    """Re-run this stage under ``torchrun`` with ``pc.nproc`` processes (gloo on CPU, NCCL on GPU)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={pc.nproc}",
        "-m",
        "pipeline",
        *sys.argv[1:],
    ]
    if "pretrain" not in sys.argv[1:]:
        raise ConfigError("pretrain.nproc > 1 is launched from the CLI: python -m pipeline pretrain")
    proc = subprocess.run(
        cmd, check=False, env={**os.environ, **worker_env()}
    )  # rank 0 logs into the stage's MLflow run
    if proc.returncode:
        raise WorkersFailed(f"torchrun: {' '.join(cmd)} exited with {proc.returncode}")


def similar_words(pc: PretrainConfig, model: Any, tok: Any, paths: Paths) -> Any:
    """The similar-word table of ``mask_token: similar`` (None for [MASK]), from the embeddings training
    starts from; cached beside the checkpoints (``similar-words/``), so a resumed run finds the same one."""
    if pc.mask_token != "similar":
        return None
    start = time.perf_counter()
    table = similar_word_table(
        model, tok, pc.similar_top_k, pc.similar_min_cosine, paths.pretrain_checkpoints.parent / "similar-words"
    )
    note(
        "pretrain",
        f"similar words for [MASK]: {coverage(table):.0%} of the vocabulary has a neighbour at cosine >= "
        f"{pc.similar_min_cosine} (the rest get a random token), {time.perf_counter() - start:.1f} s",
    )
    return table


# ----------------------------------------------------------------------------- a session, step by step (the stage's run)


@dataclass
class Blocks:
    """What pretraining reads: the train blocks (corpus, selected, plus TAPT text) and the validation blocks."""

    train: Any
    valid: Any
    block_len: int
    task_blocks: int  # of the train blocks, the tasks' train inputs (TAPT)
    selection: dict[str, Any] | None  # what the select stage chose (pretrain.selection.mode: nearest)
    shard_sizes: list[int]  # rows of each shard of ``train``, in order (the stream reads shard by shard)


def train_groups(pc: PretrainConfig) -> list[str]:
    """The shard groups pretraining trains on: corpus blocks (or sentence pairs), and the tasks' text for TAPT."""
    corpus = ["train" if pc.sentence_objective == "none" else "train_pairs"] if pc.corpus_text else []
    return [*corpus, *([TASK_TEXT] if pc.task_text else [])]


def load_blocks(pc: PretrainConfig, paths: Paths) -> Blocks:
    """The tokenize stage's block shards as ``pretrain`` asks for them, memory-mapped; a missing or stale input names
    its stage."""
    from datasets import concatenate_datasets

    tokenized = paths.pretrain_blocks
    train, shard_sizes = open_group(tokenized, "train")
    valid, _ = open_group(tokenized, "validation")
    block_len = len(train[0]["input_ids"])
    if pc.sentence_objective != "none":
        if not has_group(tokenized, "train_pairs"):  # tokenize.sentence_pairs is true (config.py checks it): older
            raise missing_input(tokenized / "train_pairs", "no sentence pairs")
        train, shard_sizes = open_group(tokenized, "train_pairs")
    selection = None
    if pc.selection.mode == "nearest":  # kNN-TAPT: only the corpus blocks the select stage chose
        train, selection = selected_blocks(train, paths)
        shard_sizes = [len(train)]  # the chosen blocks, in the select stage's order, are read as one shard
    task_blocks = 0
    if pc.task_text:  # DAPT+TAPT: the tasks' unlabelled train inputs join the corpus blocks (as their own shard)
        task_text, _ = open_group(tokenized, TASK_TEXT)
        task_blocks = len(task_text)
        if not pc.corpus_text:  # TAPT: the tasks' inputs alone (the corpus's validation blocks still evaluate)
            train, shard_sizes = task_text, [task_blocks]
        else:
            train = concatenate_datasets([train, task_text])
            shard_sizes = [*shard_sizes, task_blocks]
    if pc.masking != "token" and "word_ids" not in train.column_names:  # tokenize.whole_word is true: older outputs
        raise missing_input(tokenized / "train", "blocks without word ids")
    if len(valid) == 0:
        raise DataError(tokenized / "validation", None, "no-documents", "no validation blocks to evaluate on")
    return Blocks(train, valid, block_len, task_blocks, selection, shard_sizes)


def resume_point(cfg: Config, paths: Paths, precision: Precision, model: Any) -> tuple[Path | None, list[str]]:
    """The checkpoint to resume from (rank 0 decides, the other ranks follow) and what was done to find it; a
    checkpoint whose weights are not ``model``'s (a tensor missing, another shape or dtype) is set aside."""
    import torch

    log: list[str] = []
    rank0 = int(os.environ.get("RANK", "0")) == 0
    resume = (
        prepare_checkpoints(
            paths.pretrain_checkpoints,
            run_fingerprint(cfg, paths, precision),
            log,
            {"precision": precision.name},
            weights_layout(model),
        )
        if rank0
        else None
    )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # rank 0 decides where to resume; the others follow
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        shared = [str(resume) if resume else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        resume = Path(shared[0]) if shared[0] else None
    for line in log:
        print(f"pretrain: {line}", file=sys.stderr)
    if rank0:
        keep_curves_until(paths.pretrain_curves_in_progress, step_of(resume) if resume else 0)
    return resume, log


def budget_plan(pc: PretrainConfig, paths: Paths, resume: Path | None, eval_seconds: float) -> BudgetPlan | None:
    """The wall-clock budget's plan (``pretrain.budget_minutes``), or ``None`` for a fixed step count."""
    plan_path = paths.pretrain_checkpoints / BUDGET_PLAN
    if int(os.environ.get("RANK", "0")) == 0 and not resume and plan_path.exists():
        plan_path.unlink()  # a fresh run plans anew (checkpoints of another configuration were set aside)
    if not pc.budget_minutes:
        return None
    return BudgetPlan(pc.budget_minutes, pc.max_steps, pc.eval_steps, eval_seconds, plan_path)


@dataclass
class Session:
    """What one run of the stage trained: where it resumed from, its seconds and tokens, its loss."""

    resume: Path | None
    log: list[str]  # what was done with the checkpoints found
    seconds: float
    tokens: int  # this session's tokens only (a resumed run's earlier ones are not counted)
    train_loss: float  # nan where a finished run was only restored


def train_session(trainer: Any, resume: Path | None, log: list[str], total_steps: int) -> Session:
    """Train from scratch or from ``resume``; a run that had already finished only restores its final weights."""
    resumed_state = json.loads((resume / "trainer_state.json").read_text()) if resume else {}
    start = time.perf_counter()
    if resume and resumed_state["global_step"] >= total_steps:
        # training had finished before the run died: take the final weights, train no further
        # (the Trainer would run one extra step when resumed at max_steps)
        restore_weights(trainer.model, resume)
        trainer.state.global_step = resumed_state["global_step"]
        trainer.state.num_input_tokens_seen = resumed_state.get("num_input_tokens_seen", 0)
        train_loss = float("nan")
    else:
        if resume:
            trainer.resume_stream(resume, resumed_state["global_step"])
        with (
            naming_writes(lambda: f"writing checkpoints under {trainer.args.output_dir}"),
            frozen_heap(),
            training_kernels(trainer.model, trainer.precision),
        ):
            train_loss = float(trainer.train(resume_from_checkpoint=str(resume) if resume else None).training_loss)
    seconds = time.perf_counter() - start
    tokens = int(trainer.state.num_input_tokens_seen) - int(resumed_state.get("num_input_tokens_seen", 0))
    return Session(resume, log, seconds, tokens, train_loss)


@dataclass
class HeldOut:
    """One model's scores on the fixed held-out masks (:func:`held_out_scores`)."""

    perplexity: float  # masked-LM perplexity (ELECTRA: the generator's)
    rtd: dict[str, Any] | None  # ELECTRA: the discriminator's accuracy, AUC and the share of tokens replaced


def pretrain_report(
    cfg: Config,
    precision: Precision,
    trainer: Any,
    blocks: Blocks,
    session: Session,
    held_out: tuple[HeldOut, HeldOut],
    similar: Any,
    plan: BudgetPlan | None,
) -> dict[str, Any]:
    """reports/pretrain.json: what was trained, how fast, and the held-out perplexity (base, adapted), with
    ELECTRA's discriminator scores beside it."""
    pc = cfg.pretrain
    base, adapted = held_out
    base_ppl, adapted_ppl = base.perplexity, adapted.perplexity
    timer = next(c for c in trainer.callback_handler.callbacks if isinstance(c, WarmupTimer))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokens_seen = int(trainer.state.num_input_tokens_seen)
    report = {
        "base_model": pc.base_model,
        "masking": pc.masking,
        "mask_token": pc.mask_token,
        "similar_word_coverage": None if similar is None else round(coverage(similar), 4),
        "mlm_head": pc.mlm_head,
        "device": precision.device,
        "world_size": world,
        **precision.as_report(),
        "training_weights": "bf16, fp32 masters" if trainer.bf16_weights else "fp32",  # training.master_weights
        "global_step": trainer.state.global_step,
        "resumed_from": session.resume.name if session.resume else None,
        "checkpoint_log": session.log,
        "global_batch": pc.micro_batch_size * pc.gradient_accumulation_steps * world,
        "block_length": blocks.block_len,
        "train_blocks": len(blocks.train),
        "task_text_blocks": blocks.task_blocks,
        "eval_blocks": min(len(blocks.valid), pc.eval_max_blocks),
        "tokens_seen": tokens_seen,
        "train_seconds": round(session.seconds, 1),
        "tokens_per_s": round(session.tokens / max(session.seconds, 1e-9)),  # this session's tokens only
        **timer.summary(),
        "train_loss": round(session.train_loss, 4) if math.isfinite(session.train_loss) else None,
        "base_perplexity": round(base_ppl, 3),
        "adapted_perplexity": round(adapted_ppl, 3),
        "perplexity_ratio": round(adapted_ppl / base_ppl, 4),
        **budget_report(pc, plan, session.seconds, tokens_seen, len(blocks.train), blocks.block_len),
    }
    if blocks.selection is not None:  # only then, so a run on every block writes the report it always did
        report["selection"] = blocks.selection
    if pc.objective == "electra":  # likewise: an MLM run's report is what it always was
        report["objective"] = "electra"
        report["electra"] = {
            **pc.electra.model_dump(),
            "generator_layers": trainer.model.generator.config.num_hidden_layers,
            "base": base.rtd,
            "adapted": adapted.rtd,
        }
    return report
