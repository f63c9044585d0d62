"""Task metrics and the paired bootstrap: plain functions over gold and predicted labels.

Classification metrics come from scikit-learn, entity-level NER metrics from ``seqeval`` (strict
IOB2), QA exact match / F1 follow the official SQuAD v1.1 evaluation script. Nothing here needs
a model, so every function is tested on hand-made examples.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------- classification


def classification_metrics(gold: Sequence[int], pred: Sequence[int]) -> dict[str, float]:
    """Accuracy, macro-F1 and micro-F1 (scikit-learn).

    Macro-F1 averages over the labels that occur in gold or predictions (sklearn's behaviour
    with ``labels=None``), so a label absent from a test set does not count as F1 = 0.
    """
    from sklearn.metrics import accuracy_score, f1_score

    if not len(gold):
        return {"accuracy": 0.0, "macro_f1": 0.0, "micro_f1": 0.0}
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "macro_f1": float(f1_score(gold, pred, average="macro", zero_division=0)),
        "micro_f1": float(f1_score(gold, pred, average="micro", zero_division=0)),
    }


def confusion(gold: Sequence[int], pred: Sequence[int], num_labels: int) -> list[list[int]]:
    """Confusion counts, rows = gold label, columns = predicted label."""
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(gold, pred, labels=list(range(num_labels))).tolist()


# ----------------------------------------------------------------------------- NER


def entity_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Entity-level precision, recall and F1 (seqeval, strict IOB2), overall and per entity type."""
    from seqeval.metrics import classification_report
    from seqeval.scheme import IOB2

    if not len(gold):
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0, "per_type": {}}
    report = classification_report(
        [list(g) for g in gold], [list(p) for p in pred], mode="strict", scheme=IOB2, output_dict=True, zero_division=0
    )
    micro = report.pop("micro avg")
    per_type = {
        k: {
            "precision": float(v["precision"]),
            "recall": float(v["recall"]),
            "f1": float(v["f1-score"]),
            "support": int(v["support"]),
        }
        for k, v in report.items()
        if not k.endswith(" avg")
    }
    return {
        "precision": float(micro["precision"]),
        "recall": float(micro["recall"]),
        "f1": float(micro["f1-score"]),
        "per_type": per_type,
    }


# ----------------------------------------------------------------------------- QA


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(prediction: str, truth: str) -> float:
    pred_tokens, true_tokens = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = collections.Counter(pred_tokens) & collections.Counter(true_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(true_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_example_scores(answers: Sequence[Sequence[str]], predictions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-example exact match and F1 (each the max over the gold answers), in [0, 1]."""
    em = np.array(
        [
            max((float(normalize_answer(p) == normalize_answer(a)) for a in golds), default=0.0)
            for golds, p in zip(answers, predictions, strict=True)
        ]
    )
    f1 = np.array(
        [max((_token_f1(p, a) for a in golds), default=0.0) for golds, p in zip(answers, predictions, strict=True)]
    )
    return em, f1


def qa_metrics(answers: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """SQuAD-style exact match and F1, as fractions in [0, 1] like every other metric here
    (the official script prints percentages: multiply by 100 to compare)."""
    em, f1 = qa_example_scores(answers, predictions)
    return {"exact_match": float(em.mean()) if len(em) else 0.0, "f1": float(f1.mean()) if len(f1) else 0.0}


# ----------------------------------------------------------------------------- bootstrap
# Per-example sufficient statistics: a metric over any resample is a function of the
# multiplicity-weighted sum of its examples' rows. The libraries above recompute from scratch
# (1-10 ms per call), too slow for 1000 resamples x tasks; these give the same numbers (tested
# against scikit-learn and seqeval) in microseconds.


def classification_stats(gold: Sequence[int], pred: Sequence[int], num_labels: int) -> np.ndarray:
    """One row per example: a one-hot cell of the flattened confusion matrix (gold x predicted)."""
    stats = np.zeros((len(gold), num_labels * num_labels))
    stats[np.arange(len(gold)), np.asarray(gold, dtype=int) * num_labels + np.asarray(pred, dtype=int)] = 1
    return stats


def classification_from_stats(summed: np.ndarray, num_labels: int) -> dict[str, float]:
    """Accuracy, macro-F1 (over labels in gold or predictions, as scikit-learn) and micro-F1 from confusion counts."""
    m = summed.reshape(num_labels, num_labels)
    total, tp = m.sum(), np.diag(m)
    support, predicted = m.sum(1), m.sum(0)
    present = (support + predicted) > 0
    f1 = np.divide(2 * tp, support + predicted, out=np.zeros(num_labels), where=present)
    accuracy = float(tp.sum() / total) if total else 0.0
    return {"accuracy": accuracy, "macro_f1": float(f1[present].mean()) if present.any() else 0.0, "micro_f1": accuracy}


def entity_spans(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """The entities of one sentence's tags as ``(start word, end word exclusive, type)``, strict IOB2 as seqeval."""
    from seqeval.scheme import IOB2, Entities

    return {(e.start, e.end, e.tag) for e in Entities([list(tags)], IOB2).entities[0]}


def entity_stats(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> np.ndarray:
    """One row per sentence: (correct entities, predicted entities, gold entities), strict IOB2 as seqeval."""
    rows = []
    for g, p in zip(gold, pred, strict=True):
        gs, ps = entity_spans(g), entity_spans(p)
        rows.append((len(gs & ps), len(ps), len(gs)))
    return np.array(rows, dtype=float).reshape(-1, 3)


def entity_from_stats(summed: np.ndarray) -> dict[str, float]:
    correct, predicted, actual = summed
    precision = correct / predicted if predicted else 0.0
    recall = correct / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": float(precision), "recall": float(recall), "f1": float(f1)}


def qa_stats(answers: Sequence[Sequence[str]], predictions: Sequence[str]) -> np.ndarray:
    """One row per example: (exact match, F1, 1)."""
    em, f1 = qa_example_scores(answers, predictions)
    return np.stack([em, f1, np.ones_like(em)], axis=1).reshape(-1, 3)


def qa_from_stats(summed: np.ndarray) -> dict[str, float]:
    em, f1, n = summed
    return {"exact_match": float(em / n) if n else 0.0, "f1": float(f1 / n) if n else 0.0}


def paired_bootstrap(
    stats_a: np.ndarray,
    stats_b: np.ndarray,
    metric: Callable[[np.ndarray], float],
    resamples: int,
    seed: int,
    confidence: float = 0.95,
) -> dict[str, float]:
    """Percentile bootstrap CI of ``metric(a) - metric(b)`` over paired test examples.

    ``stats_a``/``stats_b`` hold one row of sufficient statistics per test example for each
    model; ``metric`` maps a column sum to the metric. Each resample draws n examples with
    replacement and applies the same draw to both models (paired), so the interval reflects
    the difference, not the two models' separate noise.
    """
    delta = metric(stats_a.sum(0)) - metric(stats_b.sum(0))
    if len(stats_a) == 0 or resamples == 0:
        return {"delta": delta, "low": float("nan"), "high": float("nan"), "resamples": 0}
    deltas = [metric(w @ stats_a) - metric(w @ stats_b) for w in resample_weights(len(stats_a), resamples, seed)]
    low, high = percentile_interval(deltas, confidence)
    return {"delta": float(delta), "low": low, "high": high, "resamples": resamples}


def resample_weights(n: int, resamples: int, seed: int) -> Iterator[np.ndarray]:
    """For each resample, how often each of ``n`` examples was drawn (n draws with replacement); the same sequence
    for the same ``seed``, so intervals computed from it agree on their resamples."""
    rng = np.random.default_rng(seed)
    for _ in range(resamples):
        yield np.bincount(rng.integers(0, n, size=n), minlength=n).astype(float)


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of resampled ``values`` (percentile bootstrap)."""
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def bootstrap_interval(
    stats: np.ndarray, metric: Callable[[np.ndarray], float], resamples: int, seed: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of one model's ``metric`` over its test examples: the same draws as
    :func:`paired_bootstrap` with the same ``seed`` (so a model's interval and its gain's come from one set of
    resamples); ``(nan, nan)`` without examples or resamples."""
    if len(stats) == 0 or resamples == 0:
        return math.nan, math.nan
    return percentile_interval([metric(w @ stats) for w in resample_weights(len(stats), resamples, seed)], confidence)


def bootstrap_mean_delta(
    tasks: Sequence[tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], float]]],
    resamples: int,
    seed: int,
    confidence: float = 0.95,
) -> dict[str, float]:
    """Percentile bootstrap CI of the mean over tasks of ``metric(a) - metric(b)`` (:func:`paired_bootstrap`'s
    arguments per task). Each resample draws every task's test examples anew (the tasks' test sets are
    independent), paired between the two models within a task, and averages the tasks' deltas."""
    delta = float(np.mean([metric(a.sum(0)) - metric(b.sum(0)) for a, b, metric in tasks])) if tasks else math.nan
    if not tasks or resamples == 0 or any(len(a) == 0 for a, _, _ in tasks):
        return {"delta": delta, "low": math.nan, "high": math.nan, "resamples": 0}
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        deltas = []
        for a, b, metric in tasks:
            weights = np.bincount(rng.integers(0, len(a), size=len(a)), minlength=len(a)).astype(float)
            deltas.append(metric(weights @ a) - metric(weights @ b))
        means[i] = np.mean(deltas)
    low, high = percentile_interval(means.tolist(), confidence)
    return {"delta": delta, "low": low, "high": high, "resamples": resamples}


def primary_stats(
    kind: Any, spec: Any, gold: list[Any], pred_a: list[Any], pred_b: list[Any]
) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], float]]:
    """Both models' per-example statistics of one task and the function from their sum to the primary metric."""
    return kind.stats(gold, pred_a, spec), kind.stats(gold, pred_b, spec), primary_metric(kind, spec)


def primary_metric(kind: Any, spec: Any) -> Callable[[np.ndarray], float]:
    """The function from a task's summed per-example statistics to its primary metric (``kind``: its task type)."""
    return lambda summed: kind.from_stats(summed, spec)[spec.primary]
