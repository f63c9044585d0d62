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
from pipeline.modelling.electra import save_electra_parts
from pipeline.modelling.precision import resolve_precision
from pipeline.modelling.shards import MANIFEST
from pipeline.training.checkpoints import copy_curves
from pipeline.training.pretraining import (
    budget_plan,
    build_model,
    fixed_eval_set,
    held_out_scores,
    launch_distributed,
    load_blocks,
    make_trainer,
    pretrain_report,
    resume_point,
    similar_words,
    train_session,
)


def model_card(cfg: Config, report: dict[str, Any]) -> str:
    replacement = "similar word" if cfg.pretrain.mask_token == "similar" else "[MASK]"
    pc = cfg.pretrain
    if pc.objective == "electra":
        e = report["electra"]
        what = (
            f"ELECTRA-style replaced-token detection (a {e['generator_layers']}-layer generator fills the masked "
            f"positions, this encoder learns which tokens were replaced; discriminator loss weight {e['rtd_weight']:g})"
        )
        ppl_of = "the generator's held-out perplexity"
        load = (
            "`AutoModel.from_pretrained(this_dir)` (a `BertModel`: the discriminator's encoder); the generator is "
            "in `electra/generator/` (`fill-mask`), the detection head in `electra/discriminator_head.safetensors`"
        )
        rtd = f"| held-out replaced-token detection | accuracy {e['adapted']['accuracy']}, ROC AUC {e['adapted']['auc']} |\n"
    else:
        what, ppl_of, rtd = "masked-LM pretraining", "held-out perplexity", ""
        load = "`AutoModelForMaskedLM.from_pretrained(this_dir)`"
    return f"""# adaptbert domain-adapted encoder

Continued {what} (domain-adaptive pretraining) of `{pc.base_model}` on the ingested corpus.

| | |
|---|---|
| base model | `{pc.base_model}` |
| masking | {pc.masking}, p={pc.mlm_probability}, {pc.mask_replace_prob:.0%} {replacement} / {pc.random_replace_prob:.0%} random |
| corpus | {report["train_blocks"]} blocks of <= {report["block_length"]} tokens ({report["task_text_blocks"]} of them the tasks' train inputs, TAPT) |
| steps | {report["global_step"]} (global batch {report["global_batch"]} blocks) |
| tokens seen | {report["tokens_seen"]} |
| {ppl_of} | {report["base_perplexity"]:.2f} (base) -> {report["adapted_perplexity"]:.2f} (adapted), same masked positions |
{rtd}
Written by `python -m pipeline pretrain`; load with {load}.
"""


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Train (or resume), save ``models/dapt/`` and write ``reports/pretrain.json``."""
    pc = cfg.pretrain
    resolve_precision(cfg.precision)  # a config error (bf16 asked on hardware without it) before a missing input
    require_inputs(paths.pretrain_blocks / MANIFEST, paths.tokenizer)
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
        f"held-out perplexity {r['base_perplexity']} (base) -> {r['adapted_perplexity']} (adapted){rtd_line(r)}; "
        f"model: {paths.dapt}; report: {paths.pretrain_report}"
    )


def rtd_line(r: dict[str, Any]) -> str:
    """ELECTRA's held-out detection scores for the console (empty for masked-LM pretraining)."""
    if "electra" not in r:
        return ""
    e = r["electra"]
    return (
        f" of the {e['generator_layers']}-layer generator\nreplaced-token detection on the same blocks: accuracy "
        f"{e['base']['accuracy']} -> {e['adapted']['accuracy']}, ROC AUC {e['base']['auc']} -> {e['adapted']['auc']}"
    )
