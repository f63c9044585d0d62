"""The README.md of each model folder a stage writes (Hugging Face model cards of the working models, before any is
registered): ``models/dapt/`` (:func:`encoder_card`, by pretraining) and ``models/finetuned/``, ``models/baseline/``
(:func:`multitask_card`, by finetune), ``models/compressed/<variant>/`` (:func:`variant_card`, by compress). A
registered version's card is :mod:`pipeline.reporting.model_card`'s.

Kept apart from it so that pretraining depends on these few lines only, not on the task types a version's card names.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.sections.pretrain import PretrainConfig


def encoder_card(pc: PretrainConfig, report: PretrainReport) -> str:
    """The adapted encoder's README.md in ``models/dapt/`` (a Hugging Face model card), written by pretraining."""
    replacement = "similar word" if pc.mask_token == "similar" else "[MASK]"
    if pc.objective == "electra":
        e = report.electra
        assert e is not None  # an ELECTRA run's report has its part
        what = (
            f"ELECTRA-style replaced-token detection (a {e.generator_layers}-layer generator fills the masked "
            f"positions, this encoder learns which tokens were replaced; discriminator loss weight {pc.electra.rtd_weight:g})"
        )
        ppl_of = "the generator's held-out perplexity"
        load = (
            "`AutoModel.from_pretrained(this_dir)` (a `BertModel`: the discriminator's encoder); the generator is "
            "in `electra/generator/` (`fill-mask`), the detection head in `electra/discriminator_head.safetensors`"
        )
        rtd = f"| held-out replaced-token detection | accuracy {e.adapted.accuracy}, ROC AUC {e.adapted.auc} |\n"
    else:
        what, ppl_of, rtd = "masked-LM pretraining", "held-out perplexity", ""
        load = "`AutoModelForMaskedLM.from_pretrained(this_dir)`"
    return f"""# adaptbert domain-adapted encoder

Continued {what} (domain-adaptive pretraining) of `{pc.base_model}` on the ingested corpus.

| | |
|---|---|
| base model | `{pc.base_model}` |
| masking | {pc.masking}, p={pc.mlm_probability}, {pc.mask_replace_prob:.0%} {replacement} / {pc.random_replace_prob:.0%} random |
| corpus | {report.train_blocks} blocks of <= {report.block_length} tokens ({report.task_text_blocks} of them the tasks' train inputs, TAPT) |
| steps | {report.global_step} (global batch {report.global_batch} blocks) |
| tokens seen | {report.tokens_seen} |
| {ppl_of} | {report.base_perplexity:.2f} (base) -> {report.adapted_perplexity:.2f} (adapted), same masked positions |
{rtd}
Written by `python -m pipeline pretrain`; load with {load}.
"""


def multitask_card(name: str, source: str, summary: dict[str, Any], tasks: list[tuple[str, str, int, str]]) -> str:
    """A fine-tuned model's README.md (``models/finetuned/``, ``models/baseline/``): its encoder's source, its best dev
    score and one row per task (name, type, number of labels, primary metric)."""
    rows = "\n".join(f"| {n} | {kind} | {labels or '-'} | {primary} |" for n, kind, labels, primary in tasks)
    return f"""# adaptbert multi-task model: {name}

Encoder from `{source}`, fine-tuned on {len(tasks)} task(s) with one head each
(best dev mean primary metric {summary["best_dev_mean_primary"]} at step {summary["best_step"]} of {summary["steps"]}).

| task | type | labels | primary metric |
|---|---|---|---|
{rows}

Files: `encoder/` (a `BertModel`, `AutoModel.from_pretrained`), `heads.safetensors`, the tokenizer,
`tasks.json` (task types, label maps, head settings). Load both with
`pipeline.compression.variants.load_model(this_dir)`.
"""


def variant_card(name: str, what: str, tasks: dict[str, Any]) -> str:
    """The model card (README.md) of a variant directory; ``what``: how it was made from the fine-tuned model (its
    entry's card line in :data:`pipeline.compression.recipes.VARIANTS`)."""
    rows = "\n".join(f"| {n} | {d.spec.type} | {d.spec.primary} |" for n, d in tasks.items())
    return f"""# adaptbert compressed variant: {name}

`models/finetuned` {what}. Every task head is kept.

| task | type | primary metric |
|---|---|---|
{rows}

Files: `config.json` (the BertConfig), `model.safetensors` (encoder and heads), the tokenizer,
`tasks.json`, `compression.json` (what was done). Load with
`pipeline.compression.variants.load_model(this_dir)`; measured in `reports/compression.md`.
"""


def unadapted_card(base_model: str, reason: str) -> str:
    """``models/dapt/README.md`` where the adaptation chosen was none: the base model, unchanged, and why."""
    return f"# adaptbert encoder: `{base_model}`, not adapted\n\n{reason}\n"


def simcse_card(pc: PretrainConfig, steps: int) -> str:
    """``models/dapt/README.md`` of an encoder adapted with unsupervised SimCSE (``pretrain.objective: simcse``)."""
    sc = pc.simcse
    return (
        f"# adaptbert encoder: `{pc.base_model}` adapted with unsupervised SimCSE\n\n{steps} steps of "
        f"{sc.batch_size} texts (<= {sc.max_length} tokens, temperature {sc.temperature:g}) on the domain's text; "
        "the masked-LM head is the base model's, untrained.\n"
    )
