"""Sequence classification: one label per text (topic, sentiment, sentence role)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.core.errors import shorten
from pipeline.tasks.base import (
    Check,
    Record,
    Row,
    TaskType,
    classifier_outputs,
    classifier_windows,
    collate_windows,
    is_windowed,
    label_ids,
    pad_features,
    softmax,
    text_checks,
)
from pipeline.tasks.metrics import classification_from_stats, classification_metrics, classification_stats, confusion

if TYPE_CHECKING:
    from pipeline.tasks.spec import TaskSpec


class SequenceClassification(TaskType):
    name = "sequence_classification"
    fields: ClassVar[dict[str, str]] = {"text": "text", "label": "label"}
    columns: ClassVar[tuple[str, ...]] = ("text", "label")
    metrics = ("macro_f1", "micro_f1", "accuracy")
    trivial_name = "majority class"
    request_fields: ClassVar[tuple[str, ...]] = ("text",)
    pair_field: str | None = None  # the second segment's field (pair classification)
    long_text_windows = True

    def text_fields(self) -> tuple[str, ...]:
        return ("text",) if self.pair_field is None else ("text", self.pair_field)

    def normalize(self, rec: Record) -> Row:
        row: Row = {f: rec.text(f) for f in self.text_fields()}
        row["label"] = rec.label(rec.value("label"), "label")
        return row

    def input_texts(self, row: Row) -> list[str]:
        return [row[f] for f in self.text_fields()]

    def checks(self, df: Any, labels: list[str], split: str, E: Any) -> list[Check]:
        return text_checks(E, self.text_fields()) + [
            Check(
                E.ExpectColumnValuesToBeInSet(column="label", value_set=labels),
                f"labels within the label set {shorten(labels)}",
                ("label", "text"),
            ),
            Check(
                E.ExpectColumnUniqueValueCountToBeBetween(column="label", min_value=2),
                f"at least two classes in {split} (one class cannot be learned or scored)",
                (),
            ),
        ]

    def encode(self, tok: Any, rows: Sequence[Row], labels: list[str], tc: Any, task: str) -> dict[str, list]:
        return {
            "id": [r["id"] for r in rows],
            **classifier_outputs(tok, rows, tc.max_seq_length, self.pair_field),
            "labels": label_ids(rows, "label", {lbl: i for i, lbl in enumerate(labels)}, task),
        }

    def encode_long(
        self, tok: Any, rows: Sequence[Row], labels: list[str], tc: Any, task: str, max_windows: int
    ) -> dict[str, list]:
        return {
            "id": [r["id"] for r in rows],
            **classifier_windows(tok, rows, tc.max_seq_length, tc.doc_stride, self.pair_field, max_windows),
            "labels": label_ids(rows, "label", {lbl: i for i, lbl in enumerate(labels)}, task),
        }

    def collate(self, features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Any]:
        return collate_windows(features, pad_id) if is_windowed(features) else pad_features(features, pad_id)

    def score(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
        return classification_metrics(gold, pred)

    def stats(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
        return classification_stats(gold, pred, spec.num_labels)

    def from_stats(self, summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
        return classification_from_stats(summed, spec.num_labels)

    def confusion(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> list[list[int]]:
        return confusion(gold, pred, spec.num_labels)

    def output_schema(self) -> list[Any]:
        from mlflow.types.schema import ColSpec

        return [ColSpec("string", "label", required=False), ColSpec("double", "score", required=False)]

    def serve(self, predictor: Any, spec: TaskSpec, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        if spec.settings.long_text == "windows":
            s = spec.settings
            cols = classifier_windows(
                predictor.tok, recs, predictor.max_seq_length, predictor.doc_stride, self.pair_field, s.max_windows
            )
        else:
            cols = classifier_outputs(predictor.tok, recs, predictor.max_seq_length, self.pair_field)
        out = []
        for lg in predictor.logits(spec.name, cols):
            p = softmax(lg)
            out.append({"label": spec.labels[int(p.argmax())], "score": float(p.max())})
        return out
