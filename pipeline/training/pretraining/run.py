"""One masked-LM pretraining run, end to end: what the pretrain stage and the adaptation tournament's arms share.

:func:`run_pretraining` reads the packed blocks and the tokenizer of ``paths``, builds the model
(:mod:`pipeline.training.pretraining.model`), trains or resumes it, and commits ``models/dapt/`` with its model card and
``reports/pretrain.json``; :func:`keep_base` commits the base model unchanged, when the adaptation chosen is none.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from pipeline.core.config import Config
from pipeline.core.io import read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.electra import save_electra_parts
from pipeline.modelling.precision import resolve_precision
from pipeline.modelling.shards import MANIFEST
from pipeline.reporting.model_readmes import encoder_card, simcse_card, unadapted_card
from pipeline.training.checkpoints import copy_curves
from pipeline.training.pretraining.blocks import load_blocks
from pipeline.training.pretraining.budget import budget_plan
from pipeline.training.pretraining.evaluation import fixed_eval_set, held_out_scores
from pipeline.training.pretraining.launch import launch_distributed
from pipeline.training.pretraining.model import build_model
from pipeline.training.pretraining.session import (
    pretrain_report,
    resume_point,
    similar_words,
    train_session,
)
from pipeline.training.pretraining.trainer import make_trainer


def run_pretraining(cfg: Config, paths: Paths) -> PretrainReport:
    """Train (or resume) as ``cfg.pretrain`` says in ``paths``, save ``models/dapt/`` and write
    ``reports/pretrain.json`` there (the pretrain stage, and each arm of the adaptation tournament in its own root)."""
    pc = cfg.pretrain
    if pc.objective == "simcse":  # contrastive adaptation: its own loop (pipeline/training/contrastive.py)
        return run_contrastive(cfg, paths)
    resolve_precision(cfg.precision)  # a config error (bf16 asked on hardware without it) before a missing input
    require_inputs(paths.pretrain_blocks / MANIFEST, paths.tokenizer)
    if pc.nproc > 1 and "WORLD_SIZE" not in os.environ:
        launch_distributed(pc, sys.argv[1:])  # the command line this stage was started with, run again per process
        return read_report(paths.pretrain_report, PretrainReport)
    from transformers import AutoTokenizer, set_seed

    precision = resolve_precision(cfg.precision)  # before any work: bf16 asked on hardware without it stops here
    set_seed(cfg.seed)  # the fresh MLM head (and a scratch model) are initialised from it: same seed, same run
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    blocks = load_blocks(pc, paths)
    model = build_model(pc, tok, paths.tokenizer, blocks.block_len)
    similar = similar_words(pc, model, tok, paths)
    eval_items = fixed_eval_set(tok, pc, blocks.valid, similar)
    eval_start = time.perf_counter()
    base = held_out_scores(model, eval_items, tok.pad_token_id, precision, pc)
    eval_seconds = (
        time.perf_counter() - eval_start
    )  # what each evaluation during training costs (a budget plans with it)
    resume, log = resume_point(cfg, paths, precision, model)
    plan = budget_plan(pc, paths, resume, eval_seconds)
    trainer = make_trainer(cfg, paths, model, tok, blocks, eval_items, precision, similar, plan)
    session = train_session(trainer, resume, log, plan.total if plan else pc.max_steps)
    adapted = held_out_scores(trainer.model, eval_items, tok.pad_token_id, precision, pc)
    report = pretrain_report(cfg, precision, trainer, blocks, session, (base, adapted), similar, plan)
    if trainer.is_world_process_zero():
        with transaction(paths.root, "pretrain") as txn:
            out = txn.dir(paths.dapt)
            if pc.objective == "electra":  # the discriminator as a BertModel; the generator and RTD head apart
                save_electra_parts(trainer.model, out)
            else:
                trainer.save_model(str(out))
            tok.save_pretrained(out)
            (out / "README.md").write_text(encoder_card(cfg.pretrain, report), encoding="utf-8")
            txn.write_report(paths.pretrain_report, report)
            copy_curves(paths.pretrain_curves_in_progress, txn.dir(paths.pretrain_curves))
    return report


@dataclass
class Start:
    """What a run outside the masked-LM Trainer starts from: the tokenizer, blocks and model a DAPT run would build,
    the fixed held-out masks and the base model's scores on them."""

    precision: Any
    tok: Any
    blocks: Any
    model: Any
    eval_items: list[dict[str, Any]]
    base: Any


def starting_point(cfg: Config, paths: Paths) -> Start:
    """The model, data and held-out scores of ``paths`` as ``cfg.pretrain`` builds them, seeded."""
    from transformers import AutoTokenizer, set_seed

    pc = cfg.pretrain
    precision = resolve_precision(cfg.precision)
    require_inputs(paths.pretrain_blocks / MANIFEST, paths.tokenizer)
    set_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    blocks = load_blocks(pc, paths)
    model = build_model(pc, tok, paths.tokenizer, blocks.block_len)
    eval_items = fixed_eval_set(tok, pc, blocks.valid, similar_words(pc, model, tok, paths))
    base = held_out_scores(model, eval_items, tok.pad_token_id, precision, pc)
    return Start(precision, tok, blocks, model, eval_items, base)


def short_report(cfg: Config, start: Start, adapted: Any, run: dict[str, Any], **kind: Any) -> PretrainReport:
    """reports/pretrain.json of a run outside the masked-LM Trainer (none kept, SimCSE): a masked-LM run's keys, with
    ``run``'s steps, tokens, seconds, batch and loss; ``kind``: the keys of its kind (objective, adaptation)."""
    pc = cfg.pretrain
    return PretrainReport(
        **kind,
        base_model=pc.base_model,
        mlm_head=pc.mlm_head,
        device=start.precision.device,
        world_size=1,
        **start.precision.as_report(),
        global_step=run["steps"],
        resumed_from=None,
        checkpoint_log=[],
        global_batch=run["batch"],
        block_length=start.blocks.block_len,
        train_blocks=len(start.blocks.train),
        task_text_blocks=start.blocks.task_blocks,
        eval_blocks=min(len(start.blocks.valid), pc.eval_max_blocks),
        tokens_seen=run["tokens"],
        train_seconds=round(run["seconds"], 1),
        tokens_per_s=round(run["tokens"] / run["seconds"]) if run["seconds"] else 0,
        train_loss=run["loss"],
        base_perplexity=round(start.base.perplexity, 3),
        adapted_perplexity=round(adapted.perplexity, 3),
        perplexity_ratio=round(adapted.perplexity / start.base.perplexity, 4),
    )


def commit_model(paths: Paths, start: Start, report: PretrainReport, card: str) -> None:
    """``models/dapt/`` (the model, its tokenizer, ``card`` as README.md) and the report, in one transaction; no
    curves (an empty folder: nothing was logged per step) and no checkpoints (an empty folder: DVC checks every
    declared output exists)."""
    paths.pretrain_checkpoints.mkdir(parents=True, exist_ok=True)
    with transaction(paths.root, "pretrain") as txn:
        out = txn.dir(paths.dapt)
        start.model.save_pretrained(out)
        start.tok.save_pretrained(out)
        (out / "README.md").write_text(card, encoding="utf-8")
        txn.write_report(paths.pretrain_report, report)
        txn.dir(paths.pretrain_curves)


def keep_base(cfg: Config, paths: Paths, reason: str) -> PretrainReport:
    """Commit the base model unchanged as ``models/dapt/`` (with the MLM head it starts from) and a report of zero
    training steps: the adaptation chosen was none (``reason`` says why). Its held-out perplexity is measured, so
    the report reads as every other one (base = adapted)."""
    start = starting_point(cfg, paths)
    nothing = {"steps": 0, "batch": cfg.pretrain.micro_batch_size, "tokens": 0, "seconds": 0.0, "loss": None}
    report = short_report(cfg, start, start.base, nothing, adaptation="none", adaptation_reason=reason)
    commit_model(paths, start, report, unadapted_card(cfg.pretrain.base_model, reason))
    return report


def run_contrastive(cfg: Config, paths: Paths) -> PretrainReport:
    """``pretrain.objective: simcse``: the encoder of the masked-LM model built as for DAPT trained with SimCSE
    (:mod:`pipeline.training.contrastive`), its head left as it was; ``models/dapt/`` and the report committed."""
    from pipeline.training.contrastive import train_simcse

    pc, sc = cfg.pretrain, cfg.pretrain.simcse
    start = starting_point(cfg, paths)
    run = train_simcse(start.model.bert, start.blocks.train, cfg, start.tok.pad_token_id, start.precision)
    start.model.eval()
    adapted = held_out_scores(start.model, start.eval_items, start.tok.pad_token_id, start.precision, pc)
    tail = run.losses[-20:]  # the contrastive loss of the last steps
    done = {
        "steps": run.steps,
        "batch": sc.batch_size,
        "tokens": run.tokens,
        "seconds": run.seconds,
        "loss": round(sum(tail) / len(tail), 4) if tail else None,
    }
    report = short_report(cfg, start, adapted, done, objective="simcse", simcse=sc.model_dump())
    commit_model(paths, start, report, simcse_card(pc, run.steps))
    return report
