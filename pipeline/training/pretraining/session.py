"""A pretraining session step by step (what :mod:`pipeline.training.pretraining.run` calls in order): the blocks
it reads (corpus, selection, TAPT text), the resume point and its fingerprint, training, and the report.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.console import note
from pipeline.core.io import naming_writes
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.modelling.dropout import training_kernels
from pipeline.modelling.precision import Precision
from pipeline.modelling.shards import groups_digest
from pipeline.modelling.similar_words import coverage, similar_word_table
from pipeline.training.callbacks import (
    frozen_heap,
)
from pipeline.training.checkpoints import (
    fingerprint,
    keep_curves_until,
    prepare_checkpoints,
    restore_weights,
    step_of,
    weights_layout,
)
from pipeline.training.pretraining.blocks import Blocks, train_groups
from pipeline.training.pretraining.budget import BudgetPlan, WarmupTimer, budget_report
from pipeline.training.pretraining.evaluation import HeldOut


def run_fingerprint(cfg: Config, paths: Paths, precision: Precision) -> str:
    """What a checkpoint must share with this run to be resumed: params, seed, precision, training code, data and tokenizer."""
    settings = cfg.pretrain.model_dump(mode="json")
    if cfg.pretrain.selection.mode == "all":  # the selection's other settings change nothing then
        settings.pop("selection")
    payload = {"pretrain": settings, "seed": cfg.seed, "precision": precision.name}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    # the blocks by the content hashes tokenize listed (hashing the shards again would take minutes on a large corpus)
    digest.update(groups_digest(paths.pretrain_blocks, train_groups(cfg.pretrain)).encode())
    code = Path(__file__).parents[2]  # pipeline/: a resumed run must not mix two versions of the training code
    data = [paths.tokenizer / "tokenizer.json"]
    if cfg.pretrain.selection.mode == "nearest":
        data.append(paths.selection / "blocks.npy")
    return fingerprint(
        digest,
        [
            code / "stages" / "pretrain.py",
            *sorted((code / "training" / "pretraining").glob("*.py")),  # this package
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


def pretrain_report(
    cfg: Config,
    precision: Precision,
    trainer: Any,
    blocks: Blocks,
    session: Session,
    held_out: tuple[HeldOut, HeldOut],
    similar: Any,
    plan: BudgetPlan | None,
) -> PretrainReport:
    """reports/pretrain.json: what was trained, how fast, and the held-out perplexity (base, adapted), with
    ELECTRA's discriminator scores beside it."""
    pc = cfg.pretrain
    base, adapted = held_out
    base_ppl, adapted_ppl = base.perplexity, adapted.perplexity
    timer = next(c for c in trainer.callback_handler.callbacks if isinstance(c, WarmupTimer))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokens_seen = int(trainer.state.num_input_tokens_seen)
    report: dict[str, Any] = {
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
    return PretrainReport.model_validate(report)  # strict: a key the type does not name is an error here
