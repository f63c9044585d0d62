"""Regression: a real-valued score per text or text pair (semantic similarity, readability, severity).

One linear output on the pooled sequence, trained with mean squared error on the raw score (as
GLUE's STS-B recipe does). Scored with Pearson and Spearman correlation (scipy) and MSE; the
trivial baseline predicts the mean train score. ``text_pair`` is optional: a task whose records
carry it is a pair task, and validation checks that its records all do (or none does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.tasks.base import (
    Check,
    Mistake,
    Record,
    Row,
    TaskType,
    classifier_outputs,
    pad_with_float_labels,
    text_checks,
)

if TYPE_CHECKING:
    from pipeline.tasks.spec import TaskSpec


def _score(value: Any, rec: Record) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise rec.error("wrong-type", f"field '{rec.column('score')}' must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise rec.error("wrong-type", f"field '{rec.column('score')}' must be a finite number, got {value!r}")
    return float(value)


def correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; 0 when either side is constant (a constant predictor carries no ranking)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    from scipy.stats import pearsonr

    return float(pearsonr(x, y).statistic)


def moments(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-pair sufficient statistics of a correlation: 1, x, y, x^2, y^2, xy."""
    return np.stack([np.ones_like(x), x, y, x * x, y * y, x * y], axis=1)


def correlation_from_moments(m: np.ndarray) -> float:
    n, sx, sy, sxx, syy, sxy = m
    vx, vy = n * sxx - sx * sx, n * syy - sy * sy
    if n < 2 or vx <= 1e-12 * max(n * sxx, 1.0) or vy <= 1e-12 * max(n * syy, 1.0):
        return 0.0
    return float((n * sxy - sx * sy) / math.sqrt(vx * vy))


class Regression(TaskType):
    name = "regression"
    graded = True
    fields: ClassVar[dict[str, str]] = {"text": "text", "text_pair": "text_pair", "score": "score"}
    optional_fields = frozenset({"text_pair"})
    columns = ("text", "text_pair", "score")
    metrics = ("pearson", "spearman")
    trivial_name = "mean train score"
    labelled = False
    min_labels = 0
    request_fields = ("text",)
    optional_request_fields = ("text_pair",)

    def normalize(self, rec: Record) -> Row:
        return {
            "text": rec.text("text"),
            "text_pair": rec.text("text_pair") if rec.has("text_pair") else None,
            "score": _score(rec.value("score"), rec),
        }

    def label_list(self, train: Sequence[Row]) -> list[str]:
        return []

    def input_texts(self, row: Row) -> list[str]:
        return [row["text"]] + ([row["text_pair"]] if row.get("text_pair") is not None else [])

    def checks(self, df: Any, labels: list[str], split: str, E: Any) -> list[Check]:
        df["has_pair"] = df["text_pair"].map(lambda t: t is not None) if "text_pair" in df else False
        return text_checks(E, ("text",)) + [
            Check(
                E.ExpectColumnUniqueValueCountToBeBetween(column="has_pair", max_value=1),
                "text_pair given for every example or for none (a task is either single texts or pairs)",
                ("has_pair", "text"),
            ),
            Check(
                E.ExpectColumnStdevToBeBetween(column="score", min_value=1e-12),
                f"the scores of {split} vary (a constant target cannot be correlated with)",
                (),
            ),
        ]

    def label_counts(self, train: Any) -> None:
        return None

    def _pair_key(self, rows: Sequence[Any]) -> str | None:
        return "text_pair" if rows and rows[0].get("text_pair") is not None else None

    def encode(self, tok: Any, rows: Sequence[Row], labels: list[str], tc: Any, task: str) -> dict[str, list]:
        return {
            "id": [r["id"] for r in rows],
            **classifier_outputs(tok, rows, tc.max_seq_length, self._pair_key(rows)),
            "labels": [float(r["score"]) for r in rows],
        }

    def make_head(self, hidden: int, spec: TaskSpec, dropout: float) -> Any:
        from pipeline.modelling.heads import ClassificationHead

        return ClassificationHead(hidden, 1, spec.settings.pooling, dropout)

    def loss(self, logits: Any, batch: dict[str, Any], weight: Any) -> Any:
        from torch import nn

        return nn.functional.mse_loss(logits.float()[:, 0], batch["labels"])

    def distill_loss(self, student: Any, teacher: Any, batch: dict[str, Any], temperature: float) -> Any:
        """The teacher's score is the soft target: MSE to it (a temperature has no meaning for one real output)."""
        from torch import nn

        return nn.functional.mse_loss(student.float(), teacher.float())

    def collate(self, features: Sequence[dict[str, Any]], pad_id: int) -> Any:
        return pad_with_float_labels(features, pad_id)

    def balanced_weights(self, train_labels: Sequence[Any], spec: TaskSpec) -> None:
        return None

    def decode(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list:
        return [float(np.asarray(lg).reshape(-1)[0]) for lg in logits]

    def gold(self, rows: Sequence[Row], spec: TaskSpec) -> list:
        return [float(r["score"]) for r in rows]

    def confidences(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list[Any]:
        return [None] * len(rows)  # a score has no probability

    def shown_answer(self, row: Row, answer: Any, spec: TaskSpec) -> str:
        return f"{answer:.3f}"

    def mistake(self, row: Row, gold: Any, pred: Any, confidence: Any, spec: TaskSpec) -> Mistake | None:
        """Every score is off by some amount: ranked by the absolute error (the analysis lists the furthest)."""
        if gold == pred:
            return None
        return Mistake(f"{gold:.3f}", f"{pred:.3f}", None, abs(gold - pred), ())

    def trivial(self, train: Sequence[Row], rows: Sequence[Row], spec: TaskSpec) -> list:
        return [float(np.mean([r["score"] for r in train]))] * len(rows)

    def score(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
        from scipy.stats import rankdata

        g, p = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
        return {
            "pearson": correlation(g, p),
            "spearman": correlation(rankdata(g), rankdata(p)),  # scipy's spearmanr is Pearson of the midranks
            "mse": float(np.mean((g - p) ** 2)) if len(g) else 0.0,
        }

    def stats(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
        """Moments of (gold, pred), of their full-sample midranks, and the squared error.

        Spearman is Pearson over ranks. In a bootstrap resample the ranks are kept from the full
        test set rather than recomputed, so the resampled Spearman is an approximation (exact on
        the full set), the usual price for the linear statistics the paired bootstrap runs on.
        """
        from scipy.stats import rankdata

        g, p = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
        return np.concatenate([moments(g, p), moments(rankdata(g), rankdata(p)), ((g - p) ** 2)[:, None]], axis=1)

    def from_stats(self, summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
        n = summed[0]
        return {
            "pearson": correlation_from_moments(summed[:6]),
            "spearman": correlation_from_moments(summed[6:12]),
            "mse": float(summed[12] / n) if n else 0.0,
        }

    def output_schema(self) -> list[Any]:
        from mlflow.types.schema import ColSpec

        return [ColSpec("double", "value", required=False)]

    def serve(self, predictor: Any, spec: TaskSpec, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """A ``value`` per request; requests with a ``text_pair`` are encoded as pairs, the others alone."""
        out: list[dict[str, Any]] = [{}] * len(recs)
        for has_pair in (False, True):
            idx = [i for i, r in enumerate(recs) if bool(r.get("text_pair")) == has_pair]
            if not idx:
                continue
            group = [recs[i] for i in idx]
            cols = classifier_outputs(predictor.tok, group, predictor.max_seq_length, "text_pair" if has_pair else None)
            for i, lg in zip(idx, predictor.logits(spec.name, cols), strict=True):
                out[i] = {"value": float(np.asarray(lg).reshape(-1)[0])}
        return out
