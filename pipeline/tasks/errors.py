"""Error analysis of one task's test predictions: what a model confuses, its most confident mistakes, what
adaptation fixed and what it broke, and (NER) mentions seen or unseen in train; and the predictions file.

What a mistake is, its confidence and its confusion pairs come from the task type
(:meth:`~pipeline.tasks.base.TaskType.mistake`, :meth:`~pipeline.tasks.base.TaskType.seen_unseen`, ...):
nothing here switches on a type. The evaluate stage writes the analysis to ``reports/errors.json`` and every
test answer to ``reports/predictions/<task>.jsonl``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.tasks.base import Mistake, Row, TaskType

if TYPE_CHECKING:
    from pipeline.tasks.spec import TaskSpec
    from pipeline.training.multitask import Scored

TEXT_CHARS = 300  # an input longer than this is cut in the analysis (the predictions file keeps it whole)


def mistakes_of(kind: TaskType, spec: TaskSpec, rows: Sequence[Row], scored: Scored) -> list[Mistake | None]:
    """Per test example, what is wrong with the model's answer (``None``: right)."""
    confidence = scored.confidence if scored.confidence is not None else [None] * len(rows)
    return [
        kind.mistake(row, g, p, c, spec)
        for row, g, p, c in zip(rows, scored.gold, scored.pred, confidence, strict=True)
    ]


def shorten_text(text: str, chars: int = TEXT_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def model_errors(kind: TaskType, rows: Sequence[Row], mistakes: Sequence[Mistake | None], top: int) -> dict[str, Any]:
    """One model's errors on a task: how many, the ``top`` confusion pairs and the ``top`` most confident
    mistakes (for graded types: the furthest off) with their text."""
    wrong = [(i, m) for i, m in enumerate(mistakes) if m is not None]
    pairs = Counter(pair for _, m in wrong for pair in m.confusions)
    listed = sorted(wrong, key=lambda im: (-im[1].rank, im[0]))[:top]
    return {
        "wrong": None if kind.graded else len(wrong),
        "confusions": [{"gold": g, "pred": p, "count": n} for (g, p), n in pairs.most_common(top)],
        "mistakes": [
            {
                "index": i,
                "id": rows[i].get("id"),
                "text": shorten_text(kind.shown_input(rows[i])),
                "gold": m.gold,
                "pred": m.pred,
                "confidence": m.confidence,
            }
            for i, m in listed
        ],
    }


def task_errors(
    kind: TaskType, spec: TaskSpec, train: Sequence[Row], rows: Sequence[Row], scored: dict[str, Scored], top: int
) -> tuple[dict[str, Any], dict[str, list[Mistake | None]]]:
    """The error analysis of one task for every scored model (``adapted``, ``baseline``), and each model's
    per-example mistakes (for the predictions file)."""
    mistakes = {model: mistakes_of(kind, spec, rows, s) for model, s in scored.items()}
    out: dict[str, Any] = {"type": spec.type, "examples": len(rows), "graded": kind.graded}
    for model, s in scored.items():
        out[model] = model_errors(kind, rows, mistakes[model], top)
        if (split := kind.seen_unseen(train, rows, s.gold, s.pred, spec)) is not None:
            out[model]["seen_unseen"] = split
    if "baseline" in mistakes and not kind.graded:
        pairs = list(zip(mistakes["baseline"], mistakes["adapted"], strict=True))
        out["changed"] = {  # examples one model got right and the other wrong
            "fixed": sum(b is not None and a is None for b, a in pairs),
            "broken": sum(b is None and a is not None for b, a in pairs),
        }
    return out, mistakes


def one_number(confidence: Any) -> float | None:
    """A prediction's confidence as one number: a type that answers in parts (words, labels) gives its least sure."""
    if confidence is None or isinstance(confidence, float):
        return None if confidence is None else round(confidence, 5)
    return round(min(confidence), 5) if len(confidence) else None


def prediction_records(
    kind: TaskType,
    spec: TaskSpec,
    rows: Sequence[Row],
    scored: dict[str, Scored],
    mistakes: dict[str, list[Mistake | None]],
) -> list[dict[str, Any]]:
    """Every test example with its gold answer and each model's answer, confidence and whether it is right."""
    gold = next(iter(scored.values())).gold
    records = []
    for i, row in enumerate(rows):
        record: dict[str, Any] = {
            "index": i,
            "id": row.get("id"),
            "input": kind.shown_input(row),
            "gold": kind.shown_answer(row, gold[i], spec),
        }
        for model, s in scored.items():
            record[model] = kind.shown_answer(row, s.pred[i], spec)
            record[f"{model}_confidence"] = one_number(s.confidence[i]) if s.confidence is not None else None
            record[f"{model}_correct"] = None if kind.graded else mistakes[model][i] is None
        records.append(record)
    return records
