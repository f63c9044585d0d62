"""Multi-label classification: any number of labels per text (topics, MeSH terms, intents).

A sigmoid per label (binary cross-entropy); a label is predicted when its probability reaches 0.5.
Scored with micro- and macro-F1 over labels (macro over labels present in gold or predictions, as
for single-label classification), subset accuracy and F1 per label. Labels come as a list (JSONL,
Parquet) or as one string joined by ``|`` (CSV/TSV); an example may have none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.core.errors import DataError, shorten
from pipeline.tasks.base import (
    Check,
    Mistake,
    Record,
    Row,
    TaskType,
    classifier_outputs,
    pad_with_float_labels,
    sigmoid,
    text_checks,
)

if TYPE_CHECKING:
    from pipeline.tasks.spec import TaskSpec

SEPARATOR = "|"  # labels joined in one CSV/TSV cell
THRESHOLD = 0.5  # sigmoid probability at which a label is predicted


def multi_hot(label_sets: Sequence[Sequence[str]], labels: list[str]) -> np.ndarray:
    """``[examples, labels]`` 0/1 matrix of label sets."""
    index = {lbl: i for i, lbl in enumerate(labels)}
    out = np.zeros((len(label_sets), len(labels)), dtype=np.int64)
    for row, chosen in enumerate(label_sets):
        for lbl in chosen:
            out[row, index[lbl]] = 1
    return out


def label_stats(gold: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """One row per example: per label true positive, false positive, false negative; then exact match, then 1."""
    tp, fp, fn = gold & pred, (1 - gold) & pred, gold & (1 - pred)
    exact = (gold == pred).all(axis=1, keepdims=True)
    return np.concatenate([tp, fp, fn, exact, np.ones_like(exact)], axis=1).astype(float)


def label_scores(summed: np.ndarray, num_labels: int) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """Micro/macro F1 and subset accuracy from summed :func:`label_stats`; also F1 and support per label."""
    k = num_labels
    tp, fp, fn = summed[:k], summed[k : 2 * k], summed[2 * k : 3 * k]
    exact, examples = summed[3 * k], summed[3 * k + 1]
    denom = 2 * tp + fp + fn
    f1 = np.divide(2 * tp, denom, out=np.zeros(k), where=denom > 0)
    present = denom > 0  # labels in gold or predictions
    metrics = {
        "micro_f1": float(2 * tp.sum() / denom.sum()) if denom.sum() else 0.0,
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "subset_accuracy": float(exact / examples) if examples else 0.0,
    }
    return metrics, f1, tp + fn


class MultilabelClassification(TaskType):
    name = "multilabel_classification"
    fields: ClassVar[dict[str, str]] = {"text": "text", "labels": "labels"}
    columns = ("text", "labels")
    metrics = ("micro_f1", "macro_f1", "subset_accuracy")
    trivial_name = "most frequent train label set"
    min_labels = 1
    request_fields = ("text",)

    def normalize(self, rec: Record) -> Row:
        value = rec.value("labels")
        if isinstance(value, str):
            value = [v.strip() for v in value.split(SEPARATOR)] if value.strip() else []
        if not isinstance(value, list):
            raise rec.error(
                "wrong-type",
                f"field '{rec.column('labels')}' must be a list of labels or a '{SEPARATOR}'-joined string, "
                f"got {type(value).__name__}",
            )
        if any(isinstance(v, str) and not v.strip() for v in value):  # "a|b|": the empty label would be kept
            raise rec.error(
                "empty-label",
                f"field '{rec.column('labels')}' holds an empty label (a '{SEPARATOR}' at the start or end, or two in "
                f"a row?): {rec.value('labels')!r}",
            )
        chosen = [rec.label(v, "labels") for v in value]
        return {"text": rec.text("text"), "labels": sorted(set(chosen))}  # a label given twice counts once

    def label_list(self, train: Sequence[Row]) -> list[str]:
        return sorted({lbl for row in train for lbl in row["labels"]})

    def checks(self, df: Any, labels: list[str], split: str, E: Any) -> list[Check]:
        known = set(labels)
        df["unknown_labels"] = df["labels"].map(lambda chosen: sum(lbl not in known for lbl in chosen))
        df["label_list"] = df["labels"].map(lambda chosen: SEPARATOR.join(chosen))
        return text_checks(E, ("text",)) + [
            Check(
                E.ExpectColumnValuesToBeBetween(column="unknown_labels", max_value=0),
                f"labels within the label set {shorten(labels)}",
                ("label_list", "text"),
            )
        ]

    def label_counts(self, train: Any) -> Counter[str]:
        return Counter(lbl for chosen in train["labels"] for lbl in chosen)

    def encode(self, tok: Any, rows: Sequence[Row], labels: list[str], tc: Any, task: str) -> dict[str, list]:
        known = set(labels)
        for r in rows:
            unknown = [lbl for lbl in r["labels"] if lbl not in known]
            if unknown:
                raise DataError(
                    r["source_file"],
                    r["source_line"],
                    "unknown-label",
                    f"task '{task}': label '{unknown[0]}' is not in its label map {shorten(labels)}",
                )
        return {
            "id": [r["id"] for r in rows],
            **classifier_outputs(tok, rows, tc.max_seq_length, None),
            "labels": multi_hot([r["labels"] for r in rows], labels).astype(float).tolist(),
        }

    def loss(self, logits: Any, batch: dict[str, Any], weight: Any) -> Any:
        from torch import nn

        return nn.functional.binary_cross_entropy_with_logits(logits.float(), batch["labels"], pos_weight=weight)

    def distill_loss(self, student: Any, teacher: Any, batch: dict[str, Any], temperature: float) -> Any:
        """Each label is its own Bernoulli: BCE against the teacher's softened probabilities, times T^2."""
        from torch import nn

        t = temperature
        soft = nn.functional.binary_cross_entropy_with_logits(student.float() / t, (teacher.float() / t).sigmoid())
        return soft * t * t

    def collate(self, features: Sequence[dict[str, Any]], pad_id: int) -> Any:
        return pad_with_float_labels(features, pad_id)

    def balanced_weights(self, train_labels: Sequence[Any], spec: TaskSpec) -> Any:
        """BCE ``pos_weight`` per label: negatives / positives in train (1 for a label never seen)."""
        import torch

        hot = np.asarray(train_labels, dtype=float).reshape(-1, spec.num_labels)
        pos = hot.sum(0)
        weight = np.divide(len(hot) - pos, pos, out=np.ones(spec.num_labels), where=pos > 0)
        return torch.tensor(weight, dtype=torch.float32)

    def decode(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list:
        return [(sigmoid(np.asarray(lg)) >= THRESHOLD).astype(np.int64).tolist() for lg in logits]

    def gold(self, rows: Sequence[Row], spec: TaskSpec) -> list:
        return multi_hot([r["labels"] for r in rows], spec.labels).tolist()

    def confidences(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list[Any]:
        """Per label, the probability of the model's yes or no (sigmoid p, or 1 - p)."""
        out = []
        for lg in logits:
            p = sigmoid(np.asarray(lg, dtype=np.float64))
            out.append(np.where(p >= THRESHOLD, p, 1 - p).tolist())
        return out

    def shown_answer(self, row: Row, answer: Any, spec: TaskSpec) -> str:
        return ", ".join(lbl for lbl, hot in zip(spec.labels, answer, strict=True) if hot) or "(no label)"

    def mistake(self, row: Row, gold: Any, pred: Any, confidence: Any, spec: TaskSpec) -> Mistake | None:
        """The labels missed and those added; confidence: the mean probability of the model's wrong yes/no."""
        wrong = [i for i, (g, p) in enumerate(zip(gold, pred, strict=True)) if g != p]
        if not wrong:
            return None
        missed = [spec.labels[i] for i in wrong if gold[i]]
        added = [spec.labels[i] for i in wrong if pred[i]]
        conf = float(np.mean([confidence[i] for i in wrong])) if confidence is not None else None
        pairs = tuple((lbl, "-") for lbl in missed) + tuple(("-", lbl) for lbl in added)
        return Mistake(", ".join(missed) or "-", ", ".join(added) or "-", conf, conf or 0.0, pairs)

    def trivial(self, train: Sequence[Row], rows: Sequence[Row], spec: TaskSpec) -> list:
        top = Counter(tuple(r["labels"]) for r in train).most_common(1)[0][0]
        return multi_hot([top] * len(rows), spec.labels).tolist()

    def score(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
        metrics, f1, support = label_scores(self.stats(gold, pred, spec).sum(0), spec.num_labels)
        per_label = {lbl: {"f1": float(f1[i]), "support": int(support[i])} for i, lbl in enumerate(spec.labels)}
        return metrics | {"per_label": per_label}

    def stats(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
        shape = (len(gold), spec.num_labels)
        return label_stats(
            np.asarray(gold, dtype=np.int64).reshape(shape), np.asarray(pred, dtype=np.int64).reshape(shape)
        )

    def from_stats(self, summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
        return label_scores(summed, spec.num_labels)[0]

    def output_schema(self) -> list[Any]:
        from mlflow.types.schema import Array, ColSpec, Object, Property

        return [
            ColSpec(Array(Object([Property("label", "string"), Property("score", "double")])), "labels", required=False)
        ]

    def serve(self, predictor: Any, spec: TaskSpec, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every label whose probability reaches the threshold, most probable first."""
        out = []
        for lg in predictor.logits(spec.name, classifier_outputs(predictor.tok, recs, predictor.max_seq_length, None)):
            p = sigmoid(np.asarray(lg))
            chosen = sorted((i for i in range(len(p)) if p[i] >= THRESHOLD), key=lambda i: -p[i])
            out.append({"labels": [{"label": spec.labels[i], "score": float(p[i])} for i in chosen]})
        return out
