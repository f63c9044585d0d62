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

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError, MissingInput
from pipeline.core.io import read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.modelling.precision import resolve_precision
from pipeline.modelling.similar_words import coverage
from pipeline.training.checkpoints import keep_curves_until, prepare_checkpoints, step_of
from pipeline.training.pretraining import (
    BUDGET_PLAN,
    BudgetPlan,
    WarmupTimer,
    budget_report,
    build_model,
    fixed_eval_set,
    launch_distributed,
    make_trainer,
    masked_perplexity,
    run_fingerprint,
    selected_blocks,
    similar_words,
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


def run(cfg: Config, paths: Paths) -> dict[str, Any]:  # noqa: C901, PLR0915  # to split when training gets its floor (issue 29, parts 2 and 5)
    """Train (or resume), save ``models/dapt/`` and write ``reports/pretrain.json``."""
    pc = cfg.pretrain
    resolve_precision(cfg.precision)  # a config error (bf16 asked on hardware without it) before a missing input
    require_inputs({paths.tokenized / "pretrain" / "train.arrow": "tokenize", paths.tokenizer: "tokenize"})
    if pc.nproc > 1 and "WORLD_SIZE" not in os.environ:
        launch_distributed(pc)
        return read_report(paths.pretrain_report, "pretrain")
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, set_seed

    precision = resolve_precision(cfg.precision)  # before any work: bf16 asked on hardware without it stops here
    set_seed(cfg.seed)  # the fresh MLM head (and a scratch model) are initialised from it: same seed, same run
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    train = Dataset.from_file(str(paths.tokenized / "pretrain" / "train.arrow"))
    valid = Dataset.from_file(str(paths.tokenized / "pretrain" / "validation.arrow"))
    block_len = len(train[0]["input_ids"])
    if pc.sentence_objective != "none":
        pairs = paths.tokenized / "pretrain" / "train_pairs.arrow"
        if not pairs.exists():  # tokenize.sentence_pairs is true (config.py checks it): its outputs are older
            raise MissingInput(pairs, "no sentence pairs", "tokenize")
        train = Dataset.from_file(str(pairs))
    selection = None
    if pc.selection.mode == "nearest":  # kNN-TAPT: only the corpus blocks the select stage chose
        train, selection = selected_blocks(train, paths)
    task_blocks = 0
    if pc.task_text:  # DAPT+TAPT: the tasks' unlabelled train inputs join the corpus blocks
        from datasets import concatenate_datasets

        task_text = Dataset.from_file(str(paths.tokenized / "pretrain" / "task_text.arrow"))
        task_blocks = len(task_text)
        train = concatenate_datasets([train, task_text])
    if pc.masking != "token" and "word_ids" not in train.column_names:  # tokenize.whole_word is true: older outputs
        raise MissingInput(paths.tokenized / "pretrain" / "train.arrow", "blocks without word ids", "tokenize")
    if len(valid) == 0:
        raise DataError(
            paths.tokenized / "pretrain" / "validation.arrow",
            None,
            "no-documents",
            "no validation blocks to evaluate on",
        )
    model = build_model(pc, tok, paths.tokenizer, block_len)
    similar = similar_words(pc, model, tok, paths)
    eval_items = fixed_eval_set(tok, pc, valid, similar)
    eval_start = time.perf_counter()
    base_ppl = masked_perplexity(model, eval_items, tok.pad_token_id, precision)
    eval_seconds = (
        time.perf_counter() - eval_start
    )  # what each evaluation during training will cost (a budget plans with it)
    log: list[str] = []
    rank0 = int(os.environ.get("RANK", "0")) == 0
    resume = (
        prepare_checkpoints(
            paths.pretrain_checkpoints, run_fingerprint(cfg, paths, precision), log, {"precision": precision.name}
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
        keep_curves_until(paths.pretrain_curves, step_of(resume) if resume else 0)
    plan_path = paths.pretrain_checkpoints / BUDGET_PLAN
    if rank0 and not resume and plan_path.exists():
        plan_path.unlink()  # a fresh run plans anew (checkpoints of another configuration were set aside)
    plan = (
        BudgetPlan(pc.budget_minutes, pc.max_steps, pc.eval_steps, eval_seconds, plan_path)
        if pc.budget_minutes
        else None
    )
    trainer = make_trainer(cfg, paths, model, tok, train, eval_items, precision, block_len, similar, plan)
    resumed_state = json.loads((resume / "trainer_state.json").read_text()) if resume else {}
    start = time.perf_counter()
    if resume and resumed_state["global_step"] >= (plan.total if plan else pc.max_steps):
        # training had finished before the run died: take the final weights, train no further
        # (the Trainer would run one extra step when resumed at max_steps)
        from safetensors.torch import load_file

        trainer.model.load_state_dict(load_file(resume / "model.safetensors"), strict=False)
        trainer.model.tie_weights()
        trainer.state.global_step = resumed_state["global_step"]
        trainer.state.num_input_tokens_seen = resumed_state.get("num_input_tokens_seen", 0)
        train_loss = float("nan")
    else:
        train_loss = float(trainer.train(resume_from_checkpoint=str(resume) if resume else None).training_loss)
    seconds = time.perf_counter() - start
    session_tokens = int(trainer.state.num_input_tokens_seen) - int(resumed_state.get("num_input_tokens_seen", 0))
    adapted_ppl = masked_perplexity(trainer.model, eval_items, tok.pad_token_id, precision)
    timer = next(c for c in trainer.callback_handler.callbacks if isinstance(c, WarmupTimer))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    report = {
        "base_model": pc.base_model,
        "masking": pc.masking,
        "mask_token": pc.mask_token,
        "similar_word_coverage": None if similar is None else round(coverage(similar), 4),
        "mlm_head": pc.mlm_head,
        "device": precision.device,
        "world_size": world,
        **precision.as_report(),
        "global_step": trainer.state.global_step,
        "resumed_from": resume.name if resume else None,
        "checkpoint_log": log,
        "global_batch": pc.micro_batch_size * pc.gradient_accumulation_steps * world,
        "block_length": block_len,
        "train_blocks": len(train),
        "task_text_blocks": task_blocks,
        "eval_blocks": len(eval_items),
        "tokens_seen": int(trainer.state.num_input_tokens_seen),
        "train_seconds": round(seconds, 1),
        "tokens_per_s": round(session_tokens / max(seconds, 1e-9)),  # this session's tokens only
        **timer.summary(),
        "train_loss": round(train_loss, 4) if math.isfinite(train_loss) else None,
        "base_perplexity": round(base_ppl, 3),
        "adapted_perplexity": round(adapted_ppl, 3),
        "perplexity_ratio": round(adapted_ppl / base_ppl, 4),
        **budget_report(pc, plan, seconds, int(trainer.state.num_input_tokens_seen), len(train), block_len),
    }
    if selection is not None:  # only then, so a run on every block writes the report it always did
        report["selection"] = selection
    if trainer.is_world_process_zero():
        with transaction(paths.root, "pretrain") as txn:
            out = txn.dir(paths.dapt)
            trainer.save_model(str(out))
            tok.save_pretrained(out)
            (out / "README.md").write_text(model_card(cfg, report), encoding="utf-8")
            txn.write_report(paths.pretrain_report, report)
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
