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

from pipeline.core.config import Config
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.training.adaptation import chosen_adaptation
from pipeline.training.pretraining.run import keep_base, run_pretraining


def run(cfg: Config, paths: Paths) -> PretrainReport:
    """Train (or resume) the adaptation the adapt stage chose (``pretrain`` as it is under ``adapt.strategy:
    fixed``), save ``models/dapt/`` and write ``reports/pretrain.json``; keep the base model when it chose none."""
    cfg, arm = chosen_adaptation(cfg, paths)
    if arm is not None and arm.name == "none":
        return keep_base(cfg, paths, arm.reason)
    return run_pretraining(cfg, paths)


def summary(r: PretrainReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline pretrain`` (what ``run`` returned, read for a person)."""
    if not r.adapted:
        return (
            f"no adaptation: {r.adaptation_reason}\nheld-out perplexity {r.base_perplexity} (base, its MLM head "
            f"as loaded); model: {paths.dapt}; report: {paths.pretrain_report}"
        )
    resumed = f"resumed from {r.resumed_from}; " if r.resumed_from else ""
    if r.budget:
        used = r.budget_minutes_used_s
        resumed += (
            f"budget {r.budget.minutes_asked:g} min, {used / 60:.2f} used"
            if used is not None
            else f"budget {r.budget.minutes_asked:g} min"
        ) + f" ({r.budget.epochs} epochs); "
    warm = f", {r.warm_tokens_per_s} after {r.warmup_seconds} s of warm-up" if r.warm_tokens_per_s else ""
    return (
        f"{resumed}{r.global_step} steps, {r.tokens_seen} tokens in {r.train_seconds} s ({r.tokens_per_s} tokens/s{warm}; "
        f"{r.device} x{r.world_size}, {r.mlm_head} MLM head)\n{r.precision_reason}\n"
        f"held-out perplexity {r.base_perplexity} (base) -> {r.adapted_perplexity} (adapted){rtd_line(r)}; "
        f"model: {paths.dapt}; report: {paths.pretrain_report}"
    )


def rtd_line(r: PretrainReport) -> str:
    """ELECTRA's held-out detection scores for the console (empty for masked-LM pretraining)."""
    e = r.electra
    if e is None:
        return ""
    return (
        f" of the {e.generator_layers}-layer generator\nreplaced-token detection on the same blocks: accuracy "
        f"{e.base.accuracy} -> {e.adapted.accuracy}, ROC AUC {e.base.auc} -> {e.adapted.auc}"
    )
