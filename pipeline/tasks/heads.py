"""The task-type registry: for each task type, its head, loss, collator, decoding and metric.

Adding a task type means adding one :class:`TaskKind` entry to :data:`REGISTRY` (plus its
fields in ``config.TASK_FIELDS`` and its encoding in ``tokenize.encode_task_split``). The
multi-task model, the trainer and the evaluate stage only ever go through this table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pipeline.core.config import PRIMARY_METRICS, FinetuneTaskConfig
from pipeline.core.errors import DataError
from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.tasks.metrics import (
    classification_from_stats,
    classification_metrics,
    classification_stats,
    entity_from_stats,
    entity_metrics,
    entity_stats,
    qa_from_stats,
    qa_metrics,
    qa_stats,
)


@dataclass(frozen=True)
class TaskSpec:
    """One declared task as the model sees it: type, label map and its fine-tuning settings."""

    name: str
    type: str
    labels: list[str]
    settings: FinetuneTaskConfig

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def primary(self) -> str:
        return self.settings.metric or PRIMARY_METRICS[self.type][0]


# ----------------------------------------------------------------------------- heads


class ClassificationHead(nn.Module):
    """Pooled sequence -> dense + tanh -> label logits ([CLS] or attention-masked mean pooling)."""

    def __init__(self, hidden: int, num_labels: int, pooling: str, dropout: float) -> None:
        super().__init__()
        self.pooling = pooling
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "mean":
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        else:
            pooled = hidden[:, 0]
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(pooled)))))


class TokenHead(nn.Module):
    """Per-token label logits (BIO tags)."""

    def __init__(self, hidden: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(hidden))


class SpanHead(nn.Module):
    """Start and end logits per token: ``[batch, tokens, 2]``; padding gets -inf-like scores."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, 2)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.out(hidden)
        return logits.masked_fill(attention_mask.unsqueeze(-1) == 0, torch.finfo(logits.dtype).min / 2)


# ----------------------------------------------------------------------------- losses


def classification_loss(
    logits: torch.Tensor, batch: dict[str, torch.Tensor], weight: torch.Tensor | None
) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float(), batch["labels"], weight=weight)


def token_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor], weight: torch.Tensor | None) -> torch.Tensor:
    return nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        batch["labels"].reshape(-1),
        weight=weight,
        ignore_index=IGNORE_INDEX,
    )


def span_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor], weight: torch.Tensor | None) -> torch.Tensor:
    start, end = logits.float().unbind(-1)
    return (
        nn.functional.cross_entropy(start, batch["start_positions"])
        + nn.functional.cross_entropy(end, batch["end_positions"])
    ) / 2


# ----------------------------------------------------------------------------- collators


PAD_VALUES = {
    "labels": IGNORE_INDEX,
    "word_ids": -1,
    "offset_start": -1,
    "offset_end": -1,
}  # input_ids pad with the tokenizer's pad id
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "labels", "start_positions", "end_positions")


def pad_features(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Dynamic padding to the longest feature of the batch (never to max_seq_length).

    List-valued columns are right-padded (``input_ids`` with ``pad_id``, labels with -100,
    token types with 0); scalar columns become a 1-D tensor; an attention mask is added.
    Only model inputs and targets are kept.
    """
    longest = max(len(f["input_ids"]) for f in features)
    batch: dict[str, torch.Tensor] = {}
    for key in features[0]:
        if key not in MODEL_INPUTS:
            continue
        values = [f[key] for f in features]
        if isinstance(values[0], list):
            pad = pad_id if key == "input_ids" else PAD_VALUES.get(key, 0)
            batch[key] = torch.tensor([v + [pad] * (longest - len(v)) for v in values], dtype=torch.long)
        else:
            batch[key] = torch.tensor(values, dtype=torch.long)
    batch["attention_mask"] = torch.tensor(
        [[1] * len(f["input_ids"]) + [0] * (longest - len(f["input_ids"])) for f in features], dtype=torch.long
    )
    return batch


# ----------------------------------------------------------------------------- decoding: logits -> per-example predictions


def argmax_labels(
    features: Sequence[dict[str, Any]], logits: Sequence[np.ndarray], rows: Sequence[dict[str, Any]], spec: TaskSpec
) -> list[int]:
    return [int(np.argmax(lg)) for lg in logits]


def first_subtoken_tags(
    features: Sequence[dict[str, Any]], logits: Sequence[np.ndarray], rows: Sequence[dict[str, Any]], spec: TaskSpec
) -> list[list[str]]:
    """One tag per word of each sentence, from the word's first sub-token; words cut by truncation get ``O``."""
    out = []
    for f, lg, row in zip(features, logits, rows, strict=True):
        tags = ["O"] * len(row["tokens"])
        seen: set[int] = set()
        for pos, w in enumerate(f["word_ids"]):
            if w >= 0 and w not in seen:
                seen.add(w)
                tags[w] = spec.labels[int(np.argmax(lg[pos]))]
        out.append(tags)
    return out


@dataclass(frozen=True)
class Span:
    """A decoded answer: its text, character offsets in the context, start+end logit score and probability.

    The probability is p(start) x p(end) under the softmax of its window (as the HF QA pipeline reports it).
    """

    text: str
    start: int
    end: int
    score: float
    probability: float = 0.0


def best_span(
    features: Sequence[dict[str, Any]],
    logits: Sequence[np.ndarray],
    windows: Sequence[int],
    context: str,
    spec: TaskSpec,
) -> Span:
    """SQuAD n-best decoding of one example over its doc-stride ``windows`` (the HF ``run_qa`` post-processing).

    For each window, the ``n_best`` highest start and end logits are paired; a pair is valid
    when both lie in the context, end >= start and the span has at most ``max_answer_tokens``
    tokens. The highest start + end score over all windows wins; its character offsets cut the
    answer out of the original context (empty text and offsets -1 when no pair is valid).
    """
    n_best, max_len = spec.settings.n_best, spec.settings.max_answer_tokens
    best, best_window = Span("", -1, -1, -np.inf), -1
    for i in windows:
        starts_ok, ends_ok = np.asarray(features[i]["offset_start"]), np.asarray(features[i]["offset_end"])
        start_logits, end_logits = logits[i][:, 0], logits[i][:, 1]
        for s in np.argsort(start_logits)[::-1][:n_best]:
            for e in np.argsort(end_logits)[::-1][:n_best]:
                if starts_ok[s] < 0 or ends_ok[e] < 0 or e < s or e - s + 1 > max_len:
                    continue
                score = float(start_logits[s] + end_logits[e])
                if score > best.score:
                    best, best_window = (
                        Span(context[starts_ok[s] : ends_ok[e]], int(starts_ok[s]), int(ends_ok[e]), score),
                        i,
                    )
    if best_window < 0:
        return best
    lg = logits[best_window]
    log_z = np.logaddexp.reduce(lg[:, 0]) + np.logaddexp.reduce(lg[:, 1])
    return Span(best.text, best.start, best.end, best.score, float(np.exp(best.score - log_z)))


def example_windows(features: Sequence[dict[str, Any]]) -> dict[Any, list[int]]:
    """Example id -> indices of its doc-stride windows."""
    windows: dict[Any, list[int]] = defaultdict(list)
    for i, f in enumerate(features):
        windows[f["example_id"]].append(i)
    return windows


def best_spans(
    features: Sequence[dict[str, Any]], logits: Sequence[np.ndarray], rows: Sequence[dict[str, Any]], spec: TaskSpec
) -> list[str]:
    """The answer text of every example (:func:`best_span` over its windows)."""
    windows = example_windows(features)
    return [best_span(features, logits, windows[row["id"]], row["context"], spec).text for row in rows]


# ----------------------------------------------------------------------------- gold, trivial baselines, metrics


def gold_labels(rows: Sequence[dict[str, Any]], spec: TaskSpec) -> list[int]:
    index = {label: i for i, label in enumerate(spec.labels)}
    return [index[r["label"]] for r in rows]


def majority_label(train_rows: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], spec: TaskSpec) -> list[int]:
    top = Counter(r["label"] for r in train_rows).most_common(1)[0][0]
    return [spec.labels.index(top)] * len(rows)


def all_outside(
    train_rows: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], spec: TaskSpec
) -> list[list[str]]:
    return [["O"] * len(r["tokens"]) for r in rows]


def most_frequent_answer(
    train_rows: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], spec: TaskSpec
) -> list[str]:
    top = Counter(r["answer_texts"][0] for r in train_rows if r["answer_texts"]).most_common(1)
    return [top[0][0] if top else ""] * len(rows)


def class_metrics(gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
    return classification_metrics(gold, pred)


def ner_metrics(gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
    return entity_metrics(gold, pred)


def span_metrics(gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
    return qa_metrics(gold, pred)


# per-example statistics for the bootstrap: (gold, pred, task) -> rows; (column sum, task) -> metrics
def class_stats(gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
    return classification_stats(gold, pred, spec.num_labels)


def class_from_stats(summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
    return classification_from_stats(summed, spec.num_labels)


# ----------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class TaskKind:
    """Everything the trainer and the evaluator need to know about one task type."""

    make_head: Callable[[int, TaskSpec, float], nn.Module]  # (hidden size, task, dropout) -> head
    loss: Callable[[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None], torch.Tensor]
    collate: Callable[[Sequence[dict[str, Any]], int], dict[str, torch.Tensor]]
    decode: Callable[..., list[Any]]  # (features, per-feature logits, gold rows, task) -> one prediction per example
    gold: Callable[[Sequence[dict[str, Any]], TaskSpec], list[Any]]
    trivial: Callable[..., list[Any]]  # (train rows, gold rows, task) -> the trivial baseline's predictions
    metrics: Callable[[Sequence[Any], Sequence[Any], TaskSpec], dict[str, Any]]
    stats: Callable[[Sequence[Any], Sequence[Any], TaskSpec], np.ndarray]  # per-example sufficient statistics
    from_stats: Callable[[np.ndarray, TaskSpec], dict[str, float]]  # summed statistics -> the metrics above
    trivial_name: str
    labelled: bool = True  # has a label map (and class weights make sense)
    decode_reads_features: bool = True  # decode needs word ids / offsets (classification only needs the logits)


REGISTRY: dict[str, TaskKind] = {
    "sequence_classification": TaskKind(
        make_head=lambda h, t, p: ClassificationHead(h, t.num_labels, t.settings.pooling, p),
        loss=classification_loss,
        collate=pad_features,
        decode=argmax_labels,
        gold=gold_labels,
        trivial=majority_label,
        metrics=class_metrics,
        stats=class_stats,
        from_stats=class_from_stats,
        decode_reads_features=False,
        trivial_name="majority class",
    ),
    "pair_classification": TaskKind(  # segment A/B arrive through token_type_ids
        make_head=lambda h, t, p: ClassificationHead(h, t.num_labels, t.settings.pooling, p),
        loss=classification_loss,
        collate=pad_features,
        decode=argmax_labels,
        gold=gold_labels,
        trivial=majority_label,
        metrics=class_metrics,
        stats=class_stats,
        from_stats=class_from_stats,
        decode_reads_features=False,
        trivial_name="majority class",
    ),
    "token_classification": TaskKind(
        make_head=lambda h, t, p: TokenHead(h, t.num_labels, p),
        loss=token_loss,
        collate=pad_features,
        decode=first_subtoken_tags,
        gold=lambda rows, t: [list(r["tags"]) for r in rows],
        trivial=all_outside,
        metrics=ner_metrics,
        stats=lambda g, p, t: entity_stats(g, p),
        from_stats=lambda x, t: entity_from_stats(x),
        trivial_name="all O",
    ),
    "extractive_qa": TaskKind(
        make_head=lambda h, t, p: SpanHead(h),
        loss=span_loss,
        collate=pad_features,
        decode=best_spans,
        gold=lambda rows, t: [list(r["answer_texts"]) for r in rows],
        trivial=most_frequent_answer,
        metrics=span_metrics,
        stats=lambda g, p, t: qa_stats(g, p),
        from_stats=lambda x, t: qa_from_stats(x),
        trivial_name="most frequent train answer",
        labelled=False,
    ),
}


def kind_of(task_type: str, where: str = "tasks.json") -> TaskKind:
    """The registry entry of ``task_type``; an unknown type names the known ones."""
    if task_type not in REGISTRY:
        raise DataError(
            where, None, "unknown-task-type", f"unknown task type '{task_type}'; known types: {sorted(REGISTRY)}"
        )
    return REGISTRY[task_type]
