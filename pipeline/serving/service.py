"""Serving the multi-task model: raw text in, the answers of every task type out.

:class:`Predictor` is plain PyTorch over ``models/finetuned/`` or a compressed variant (``load_model``) and reuses the
training-time pieces through each task type's ``serve`` (the same encoding, ``predict_logits`` and
decoders that evaluate scored). It is what the MLflow pyfunc (``pipeline/serving/pyfunc_model.py``,
logged by the register stage) calls, so ``mlflow models serve`` and
``mlflow.pyfunc.load_model(...).predict(df)`` answer the same.

Input: a DataFrame with a ``task`` column and the columns the task's type reads (``request_fields``
of its module: ``text``; ``text`` + ``text_pair``; ``question`` + ``context``; NER takes raw ``text``
and splits it into words as CoNLL-style files are, see :mod:`pipeline.text.words`).
Output, one row per input row: the columns the task's type fills (``label`` and ``score``;
``entities``; ``answer`` with ``score`` and character offsets; ``labels``; ``value``), the others null; a row that
cannot be answered gets ``error`` (the row, task and field) and the others their answers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.tasks.registry import REGISTRY, kind_of


def _union(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


INPUT_COLUMNS = ("task",) + _union(
    [f for kind in REGISTRY.values() for f in kind.request_fields + kind.optional_request_fields]
)


def output_columns() -> tuple[str, ...]:
    """``task``, every answer column of every task type (needs mlflow for the types' schemas), and ``error`` (why a
    row got no answer; null for answered rows)."""
    return ("task",) + _union([c.name for kind in REGISTRY.values() for c in kind.output_schema()]) + ("error",)


class InputError(ValueError):
    """A request row the model cannot answer; the message names the row, the task and the field."""


def _absent(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))  # pandas fills missing cells with NaN


def _not_unicode(text: str) -> str | None:
    """What makes ``text`` no valid Unicode text (JSON's ``"\\ud83d"`` decodes to a lone surrogate), or ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"holds a lone surrogate (U+{ord(text[err.start]):04X}) at character {err.start}: not valid Unicode text"
    return None


class Predictor:
    """Loads ``model_dir`` once; :meth:`predict` answers a DataFrame of mixed tasks, batched per task."""

    def __init__(
        self,
        model_dir: Path,
        max_seq_length: int,
        doc_stride: int,
        batch_size: int = 32,
        precision: str = "auto",
        max_request_chars: int | None = None,
    ) -> None:
        from pipeline.compression.variants import load_model
        from pipeline.modelling.precision import resolve_precision

        self.model, self.tok = load_model(Path(model_dir))
        self.max_seq_length, self.doc_stride, self.batch_size = max_seq_length, doc_stride, batch_size
        self.precision = resolve_precision(precision)  # on the serving machine: auto may differ from where it trained
        self.max_request_chars = max_request_chars  # register.serve.max_request_chars (None: no limit)

    @property
    def tasks(self) -> dict[str, str]:
        """Task name -> task type, as the model serves them."""
        return {n: s.type for n, s in self.model.specs.items()}

    def predict(self, frame: Any) -> Any:
        """One output row per input row, in input order (see the module docstring).

        A row that cannot be answered gets its own ``error`` (naming the row, the task and the field) and the good
        rows their answers; a request no row of which can be answered, or that is malformed as a whole (no ``task``
        column, over ``max_request_chars``), is an :class:`InputError` (the scoring server's HTTP 400)."""
        if "task" not in frame.columns:
            raise InputError(
                f"the input has no 'task' column (columns: {list(frame.columns)}); tasks served: {self.tasks}"
            )
        records = frame.to_dict("records")
        self.check_size(records)
        columns = self.columns
        by_task: dict[str, list[int]] = {}
        errors: dict[int, str] = {}
        for i, rec in enumerate(records):
            try:
                by_task.setdefault(self.checked_task(i, rec), []).append(i)
            except InputError as err:
                errors[i] = str(err)
        if errors and len(errors) == len(records):
            raise InputError("; ".join(errors.values()))
        out = [self.row_error(records[i], columns, errors[i]) if i in errors else {} for i in range(len(records))]
        for task, rows in by_task.items():
            spec = self.model.specs[task]
            answers = spec.kind.serve(self, spec, [records[i] for i in rows])
            for i, ans in zip(rows, answers, strict=True):
                out[i] = {c: None for c in columns} | {"task": task} | ans
        return pd.DataFrame(
            out, columns=list(columns), dtype=object
        )  # object: null stays None (JSON null), ints stay ints

    @staticmethod
    def row_error(rec: dict[str, Any], columns: tuple[str, ...], message: str) -> dict[str, Any]:
        """The output row of a request row that cannot be answered: its task as sent (when a string), every answer
        column null, ``error`` the reason."""
        task = rec.get("task")
        return {c: None for c in columns} | {"task": task if isinstance(task, str) else None, "error": message}

    def check_size(self, records: list[dict[str, Any]]) -> None:
        """A request over ``max_request_chars`` characters of text (all rows' string fields) is refused before any
        work, naming the limit; a client splits it into several requests."""
        if self.max_request_chars is None:
            return
        size = sum(len(v) for rec in records for v in rec.values() if isinstance(v, str))
        if size > self.max_request_chars:
            raise InputError(
                f"the request holds {size:,} characters of text in {len(records)} row(s); this model answers up to "
                f"{self.max_request_chars:,} per request (register.serve.max_request_chars): send fewer or shorter rows"
            )

    def checked_task(self, i: int, rec: dict[str, Any]) -> str:
        """The task of request row ``i``, after checking it can be answered (else :class:`InputError` naming it)."""
        task = rec.get("task")
        if task not in self.model.specs:
            raise InputError(f"row {i}: unknown task {task!r}; this model serves {self.tasks}")
        kind = self.model.specs[task].kind
        where = f"row {i} (task '{task}', {kind.name})"
        for field in kind.request_fields + kind.optional_request_fields:
            if field in kind.optional_request_fields and _absent(rec.get(field)):
                rec[field] = None
            elif not isinstance(rec.get(field), str) or not rec[field].strip():
                raise InputError(f"{where}: '{field}' must be a non-empty string, got {rec.get(field)!r}")
            elif (bad := _not_unicode(rec[field])) is not None:
                raise InputError(f"{where}: '{field}' {bad}")
        problem = kind.request_problem(self.tok, self.max_seq_length, self.doc_stride, rec)
        if problem is not None:
            raise InputError(f"{where}: {problem}")
        return str(task)

    @property
    def columns(self) -> tuple[str, ...]:
        """The output columns (computed once: the types' schemas come from mlflow)."""
        if not hasattr(self, "_columns"):
            self._columns = output_columns()
        return self._columns

    def logits(self, task: str, cols: dict[str, list[Any]]) -> list[np.ndarray]:
        """Per-feature logits of ``task`` for encoded ``cols`` (what task types' ``serve`` call)."""
        from pipeline.training.multitask import Columns, predict_logits

        return predict_logits(self.model, task, Columns(cols), self.tok.pad_token_id, self.batch_size, self.precision)


def requests_from_tasks(tasks_dir: Path, per_task: int) -> Any:
    """A request frame of the first ``per_task`` test examples of every task under ``data/tasks``."""
    import json

    import pyarrow.parquet as pq

    rows = []
    for meta_file in sorted(tasks_dir.glob("*/task.json")):
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        kind = kind_of(meta["type"], str(meta_file))
        for r in pq.read_table(meta_file.parent / "test.parquet").slice(0, per_task).to_pylist():
            rows.append({"task": meta["name"], **kind.request_row(r)})
    # optional columns no task uses are left out: an all-empty column is float NaN to pandas, which
    # MLflow's schema check rejects as a string column (found on the biomed profile: no pair or QA task)
    return pd.DataFrame(rows, columns=list(INPUT_COLUMNS)).dropna(axis=1, how="all")


def signature() -> Any:
    """Input: ``task`` plus the optional request columns; output: every task type's answer columns (nullable)."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    inputs = Schema([ColSpec("string", "task")] + [ColSpec("string", c, required=False) for c in INPUT_COLUMNS[1:]])
    outputs: dict[str, Any] = {"task": ColSpec("string", "task")}
    for kind in REGISTRY.values():
        for col in kind.output_schema():
            outputs.setdefault(col.name, col)  # a column two types fill (score) has one type
    outputs["error"] = ColSpec("string", "error", required=False)  # a row that could not be answered: why
    return ModelSignature(inputs=inputs, outputs=Schema(list(outputs.values())))
