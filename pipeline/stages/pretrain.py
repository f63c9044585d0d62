"""pretrain stage: domain-adaptive continued masked-LM pretraining with the HF Trainer.

Reads the packed blocks and the tokenizer of the tokenize stage, builds ``BertForMaskedLM``
(offline MiniLM by default, any local BERT, a hub id when named, or a scratch ``BertConfig``),
initialises the rows of new vocabulary tokens as the mean of their base pieces, and trains with
dynamic masking (:mod:`pipeline.modelling.masking`). Checkpoints go to ``checkpoints/pretrain/`` (kept by
DVC between runs, not cached): an interrupted run resumes from the newest usable one with the
same step, optimiser, scheduler and RNG state; a corrupt checkpoint is skipped, and checkpoints
of a different configuration are set aside rather than resumed. The final model, tokenizer and
model card go to ``models/dapt/``; ``reports/pretrain.json`` holds the held-out perplexity of the
base and adapted models on the same fixed masks.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pipeline.core.config import Config
from pipeline.core.io import read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.modelling.precision import resolve_precision
from pipeline.training.checkpoints import copy_curves
from pipeline.training.pretraining import (
    HeldOut,
    budget_plan,
    build_model,
    fixed_eval_set,
    launch_distributed,
    load_blocks,
    make_trainer,
    masked_perplexity,
    pretrain_report,
    resume_point,
    similar_words,
    train_session,
)


def model_card(cfg: Config, report: dict[str, Any]) -> str:
    replacement = "similar word" if cfg.pretrain.mask_token == "similar" else "[MASK]"
    pc = cfg.pretrain
    return f"""# adaptbert domain-adapted encoder

Continued masked-LM pretraining (domain-adaptive pretraining) of `{pc.base_model}` on the ingested corpus.

| | |
|---|---|
| base model | `{pc.base_model}` |
| masking | {pc.masking}, p={pc.mlm_probability}, {pc.mask_replace_prob:.0%} {replacement} / {pc.random_replace_prob:.0%} random |
| corpus | {report["train_blocks"]} blocks of <= {report["block_length"]} tokens ({report["task_text_blocks"]} of them the tasks' train inputs, TAPT) |
| steps | {report["global_step"]} (global batch {report["global_batch"]} blocks) |
| tokens seen | {report["tokens_seen"]} |
| held-out perplexity | {report["base_perplexity"]:.2f} (base) -> {report["adapted_perplexity"]:.2f} (adapted), same masked positions |

Written by `python -m pipeline pretrain`; load with `AutoModelForMaskedLM.from_pretrained(this_dir)`.
"""


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Train (or resume), save ``models/dapt/`` and write ``reports/pretrain.json``."""
    pc = cfg.pretrain
    resolve_precision(cfg.precision)  # a config error (bf16 asked on hardware without it) before a missing input
    require_inputs(paths.pretrain_blocks / "train.arrow", paths.tokenizer)
    if pc.nproc > 1 and "WORLD_SIZE" not in os.environ:
        launch_distributed(pc)
        return read_report(paths.pretrain_report)
    from transformers import AutoTokenizer, set_seed

    precision = resolve_precision(cfg.precision)  # before any work: bf16 asked on hardware without it stops here
    set_seed(cfg.seed)  # the fresh MLM head (and a scratch model) are initialised from it: same seed, same run
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    blocks = load_blocks(pc, paths)
    model = build_model(pc, tok, paths.tokenizer, blocks.block_len)
    similar = similar_words(pc, model, tok, paths)
    eval_items = fixed_eval_set(tok, pc, blocks.valid, similar)
    eval_start = time.perf_counter()
    base_ppl = masked_perplexity(model, eval_items, tok.pad_token_id, precision)
    eval_seconds = (
        time.perf_counter() - eval_start
    )  # what each evaluation during training will cost (a budget plans with it)
    resume, log = resume_point(cfg, paths, precision)
    plan = budget_plan(pc, paths, resume, eval_seconds)
    trainer = make_trainer(cfg, paths, model, tok, blocks.train, eval_items, precision, blocks.block_len, similar, plan)
    session = train_session(trainer, resume, log, plan.total if plan else pc.max_steps)
    adapted_ppl = masked_perplexity(trainer.model, eval_items, tok.pad_token_id, precision)
    held_out = HeldOut(len(eval_items), base_ppl, adapted_ppl)
    report = pretrain_report(cfg, precision, trainer, blocks, session, held_out, similar, plan)
    if trainer.is_world_process_zero():
        with transaction(paths.root, "pretrain") as txn:
            out = txn.dir(paths.dapt)
            trainer.save_model(str(out))
            tok.save_pretrained(out)
            (out / "README.md").write_text(model_card(cfg, report), encoding="utf-8")
            txn.write_report(paths.pretrain_report, report)
            copy_curves(paths.pretrain_curves_in_progress, txn.dir(paths.pretrain_curves))
    return report


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline pretrain`` (what ``run`` returned, read for a person)."""
    resumed = f"resumed from {r['resumed_from']}; " if r["resumed_from"] else ""
    if r.get("budget"):
        b = r["budget"]
        used = r.get("budget_minutes_used_s")
        resumed += (
            f"budget {b['minutes_asked']:g} min, {used / 60:.2f} used"
            if used is not None
            else f"budget {b['minutes_asked']:g} min"
        ) + f" ({b['epochs']} epochs); "
    warm = f", {r['warm_tokens_per_s']} after {r['warmup_seconds']} s of warm-up" if r.get("warm_tokens_per_s") else ""
    return (
        f"{resumed}{r['global_step']} steps, {r['tokens_seen']} tokens in {r['train_seconds']} s ({r['tokens_per_s']} tokens/s{warm}; "
        f"{r['device']} x{r['world_size']}, {r['mlm_head']} MLM head)\n{r['precision_reason']}\n"
        f"held-out perplexity {r['base_perplexity']} (base) -> {r['adapted_perplexity']} (adapted); "
        f"model: {paths.dapt}; report: {paths.pretrain_report}"
    )
