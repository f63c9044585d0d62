"""Held-out evaluation of pretraining: the fixed evaluation masks (the same masked positions for every model compared)
and the masked-LM perplexity over them (with ELECTRA's detection scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.modelling.precision import Precision

MASKING_BATCH = 64  # held-out blocks masked per collator call (the fixed evaluation masks)
PERPLEXITY_BATCH = 32  # held-out blocks per forward pass when scoring perplexity
MAX_LOG_PERPLEXITY = 50.0  # exp() of a larger loss overflows; perplexities beyond e^50 mean "untrained" anyway


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


@dataclass
class HeldOut:
    """One model's scores on the fixed held-out masks (:func:`held_out_scores`)."""

    perplexity: float  # masked-LM perplexity (ELECTRA: the generator's)
    rtd: dict[str, Any] | None  # ELECTRA: the discriminator's accuracy, AUC and the share of tokens replaced


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
