"""One masked-LM pretraining run, end to end: what the pretrain stage and the adaptation tournament's arms share.

:func:`run_pretraining` reads the packed blocks and the tokenizer of ``paths``, builds the model
(:mod:`pipeline.training.pretraining`), trains or resumes it, and commits ``models/dapt/`` with its model card and
``reports/pretrain.json``; :func:`keep_base` commits the base model unchanged, when the adaptation chosen is none.
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
    """The adapted encoder's README.md (a Hugging Face model card)."""
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


def run_pretraining(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Train (or resume) as ``cfg.pretrain`` says in ``paths``, save ``models/dapt/`` and write
    ``reports/pretrain.json`` there (the pretrain stage, and each arm of the adaptation tournament in its own root)."""
    pc = cfg.pretrain
    if pc.objective == "simcse":  # contrastive adaptation: its own loop (pipeline/training/contrastive.py)
        return run_contrastive(cfg, paths)
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


def keep_base(cfg: Config, paths: Paths, reason: str) -> dict[str, Any]:
    """Commit the base model unchanged as ``models/dapt/`` (with the MLM head it starts from) and a report of zero
    training steps: the adaptation chosen was none (``reason`` says why). Its held-out perplexity is measured, so
    the report reads as every other one (base = adapted)."""
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
    report = {
        "base_model": pc.base_model,
        "adaptation": "none",
        "adaptation_reason": reason,
        "mlm_head": pc.mlm_head,
        "device": precision.device,
        "world_size": 1,
        **precision.as_report(),
        "global_step": 0,
        "resumed_from": None,
        "checkpoint_log": [],
        "global_batch": pc.micro_batch_size * pc.gradient_accumulation_steps,
        "block_length": blocks.block_len,
        "train_blocks": len(blocks.train),
        "task_text_blocks": blocks.task_blocks,
        "eval_blocks": min(len(blocks.valid), pc.eval_max_blocks),
        "tokens_seen": 0,
        "train_seconds": 0.0,
        "tokens_per_s": 0,
        "train_loss": None,
        "base_perplexity": round(base.perplexity, 3),
        "adapted_perplexity": round(base.perplexity, 3),
        "perplexity_ratio": 1.0,
    }
    with transaction(paths.root, "pretrain") as txn:
        out = txn.dir(paths.dapt)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        (out / "README.md").write_text(
            f"# adaptbert encoder: `{pc.base_model}`, not adapted\n\n{reason}\n", encoding="utf-8"
        )
        txn.write_report(paths.pretrain_report, report)
        txn.dir(paths.pretrain_curves)  # no curves: nothing was trained
    return report


def run_contrastive(cfg: Config, paths: Paths) -> dict[str, Any]:
    """``pretrain.objective: simcse``: the encoder of the masked-LM model built as for DAPT trained with SimCSE
    (:mod:`pipeline.training.contrastive`), its head left as it was; ``models/dapt/`` and the report committed."""
    from transformers import AutoTokenizer, set_seed

    from pipeline.training.contrastive import contrastive_report, train_simcse

    pc = cfg.pretrain
    precision = resolve_precision(cfg.precision)
    require_inputs(paths.pretrain_blocks / MANIFEST, paths.tokenizer)
    set_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    blocks = load_blocks(pc, paths)
    model = build_model(pc, tok, paths.tokenizer, blocks.block_len)
    eval_items = fixed_eval_set(tok, pc, blocks.valid)
    base = held_out_scores(model, eval_items, tok.pad_token_id, precision, pc)
    run = train_simcse(model.bert, blocks.train, cfg, tok.pad_token_id, precision)
    model.eval()
    adapted = held_out_scores(model, eval_items, tok.pad_token_id, precision, pc)
    report = contrastive_report(cfg, precision, blocks, run, (base, adapted))
    sc = pc.simcse
    with transaction(paths.root, "pretrain") as txn:
        out = txn.dir(paths.dapt)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        (out / "README.md").write_text(
            f"# adaptbert encoder: `{pc.base_model}` adapted with unsupervised SimCSE\n\n{run.steps} steps of "
            f"{sc.batch_size} texts (<= {sc.max_length} tokens, temperature {sc.temperature:g}) on the domain's "
            "text; the masked-LM head is the base model's, untrained.\n",
            encoding="utf-8",
        )
        txn.write_report(paths.pretrain_report, report)
        txn.dir(paths.pretrain_curves)  # no masked-LM curves
    return report
