"""Contrastive domain adaptation (``pretrain.objective: simcse``): unsupervised SimCSE on the domain's text.

Gao et al. (2021): each text goes through the encoder twice with different dropout masks; the two mean-pooled
embeddings are a positive pair, the other texts of the batch the negatives, and the loss is the cross-entropy of
their cosine similarities over ``simcse.temperature``. The shipped base (all-MiniLM-L6-v2) is itself a contrastively
trained sentence encoder, so this adapts its sentence space to the domain without the masked-LM objective, which
that model never saw. The texts are the pretraining blocks (the corpus, or the tasks' inputs: ``corpus_text`` /
``task_text`` choose as for masked-LM), cut to ``simcse.max_length`` tokens.

Written as a plain training loop, not the HF Trainer: the Trainer has no two-view batch and its checkpoint machinery
is more than a run of minutes needs (a killed run starts again). :func:`pipeline.training.pretraining.run.run_contrastive`
trains the encoder inside the masked-LM model built as for DAPT, whose head is left as it was, so the held-out
perplexity before and after says how far the encoder moved from what that head reads, and a later run can continue
from the saved model like any other.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.core.config import Config


def mean_pooled(encoder: Any, ids: Any, mask: Any) -> Any:
    """The mean of the last hidden states over real tokens (the pooling all-MiniLM-L6-v2 was trained with)."""
    hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def simcse_loss(encoder: Any, ids: Any, mask: Any, temperature: float) -> Any:
    """The unsupervised SimCSE loss of one batch: two dropout views per text, in-batch negatives."""
    import torch
    import torch.nn.functional as F

    first, second = mean_pooled(encoder, ids, mask), mean_pooled(encoder, ids, mask)
    similarity = F.cosine_similarity(first.unsqueeze(1), second.unsqueeze(0), dim=-1) / temperature
    return F.cross_entropy(similarity.float(), torch.arange(len(ids)))


def batch_of(blocks: Any, rows: np.ndarray, max_length: int, pad_id: int) -> tuple[Any, Any]:
    """Input ids and attention mask of ``rows`` of the block dataset, each cut to ``max_length`` tokens."""
    import torch

    ids = torch.full((len(rows), max_length), pad_id, dtype=torch.long)
    for i, row in enumerate(blocks.select(rows.tolist())["input_ids"]):
        cut = [t for t in row if t != pad_id][:max_length]
        ids[i, : len(cut)] = torch.tensor(cut)
    return ids, (ids != pad_id).long()


@dataclass
class SimcseRun:
    """What a SimCSE loop did: steps, real tokens read, seconds of training, the loss of every step."""

    steps: int
    tokens: int
    seconds: float
    losses: list[float]


def train_simcse(encoder: Any, blocks: Any, cfg: Config, pad_id: int, precision: Any) -> SimcseRun:
    """Train ``encoder`` in place on ``blocks`` (a dataset of ``input_ids``) with the SimCSE loss until
    ``pretrain.budget_minutes`` pass or ``pretrain.max_steps`` batches are done; a seeded order, AdamW, clipping."""
    import torch

    from pipeline.core.errors import NonFiniteLoss

    pc, sc = cfg.pretrain, cfg.pretrain.simcse
    encoder.train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=sc.learning_rate, weight_decay=pc.weight_decay)
    order = np.random.default_rng(cfg.seed).permutation(len(blocks))
    deadline = time.perf_counter() + pc.budget_minutes * 60 if pc.budget_minutes else math.inf
    run = SimcseRun(0, 0, 0.0, [])
    start = time.perf_counter()
    while run.steps < pc.max_steps and time.perf_counter() < deadline:
        at = (run.steps * sc.batch_size) % max(len(order) - sc.batch_size + 1, 1)
        ids, mask = batch_of(blocks, order[at : at + sc.batch_size], sc.max_length, pad_id)
        with precision.autocast():
            loss = simcse_loss(encoder, ids, mask, sc.temperature)
        if not torch.isfinite(loss):
            raise NonFiniteLoss(
                f"the SimCSE loss is {loss.item()} at step {run.steps + 1}: lower pretrain.simcse.learning_rate"
            )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), pc.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.steps, run.tokens = run.steps + 1, run.tokens + int(mask.sum())
        run.losses.append(loss.item())
    run.seconds = time.perf_counter() - start
    encoder.eval()
    return run
