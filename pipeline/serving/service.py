"""Serving the multi-task model: raw text in, labels / entities / answers out, for every task type.

:class:`Predictor` is plain PyTorch over ``models/finetuned/`` (``load_multitask``) and reuses the
training-time pieces: the tokenizer settings, ``predict_logits``, the QA span decoder. It is what
the MLflow pyfunc (``pipeline/serving/pyfunc_model.py``, logged by the register stage) calls, so
``mlflow models serve`` and ``mlflow.pyfunc.load_model(...).predict(df)`` answer the same.

Input: a DataFrame with a ``task`` column and, by the task's type,
``text`` (sequence classification), ``text`` + ``text_pair`` (pair classification), ``text``
(NER: split into words as in CoNLL-style files, see :func:`split_words`), ``question`` + ``context`` (extractive QA).
Output, one row per input row: ``label`` and ``score`` (classification), ``entities`` (NER: type,
text, character offsets, score), ``answer`` with ``score`` and ``answer_start``/``answer_end``
character offsets (QA); the columns that do not apply are null.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import regex

from pipeline.tasks.heads import best_span, example_windows

INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "sequence_classification": ("text",),
    "pair_classification": ("text", "text_pair"),
    "token_classification": ("text",),
    "extractive_qa": ("question", "context"),
}
INPUT_COLUMNS = ("task", "text", "text_pair", "question", "context")
OUTPUT_COLUMNS = ("task", "label", "score", "entities", "answer", "answer_start", "answer_end")


# Raw text -> words the way NER training files are tokenized: a CJK chunk char by char, otherwise
# whitespace-separated chunks with opening/closing punctuation peeled off ("aspirin." -> "aspirin",
# "."), inner punctuation kept ("mg/kg", "open-label", "20%"). It reproduces the word lists of the demo
# NER test set (150/150), NCBI-disease (940/940) and CLUENER (1075/1075 from the joined characters);
# BERT's own pre-tokenizer splits at every punctuation mark (85/150 on the demo), a train/serve skew.
CHUNK = regex.compile(r"\S+")
CJK = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u3000-\u303f\uff00-\uffef]")
OPENING = "([{\"'“‘«"
CLOSING = ".,;:!?)]}\"'”’»"


def split_words(text: str) -> list[tuple[str, tuple[int, int]]]:
    """``[(word, (start, end))]`` character offsets of the words of ``text`` (see the comment above)."""
    words: list[tuple[str, tuple[int, int]]] = []
    for m in CHUNK.finditer(text):
        s, e = m.start(), m.end()
        if CJK.search(m.group()):
            words.extend((text[i], (i, i + 1)) for i in range(s, e))
            continue
        tail = []
        while s < e - 1 and text[s] in OPENING:
            words.append((text[s], (s, s + 1)))
            s += 1
        while e - 1 > s and text[e - 1] in CLOSING:
            tail.append((text[e - 1], (e - 1, e)))
            e -= 1
        words.append((text[s:e], (s, e)))
        words.extend(reversed(tail))
    return words


class InputError(ValueError):
    """A request row the model cannot answer; the message names the row, the task and the field."""


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


class Predictor:
    """Loads ``model_dir`` once; :meth:`predict` answers a DataFrame of mixed tasks, batched per task."""

    def __init__(
        self, model_dir: Path, max_seq_length: int, doc_stride: int, batch_size: int = 32, precision: str = "auto"
    ) -> None:
        from pipeline.modelling.multitask import load_multitask
        from pipeline.modelling.precision import resolve_precision

        self.model, self.tok = load_multitask(Path(model_dir))
        self.max_seq_length, self.doc_stride, self.batch_size = max_seq_length, doc_stride, batch_size
        self.precision = resolve_precision(precision)  # on the serving machine: auto may differ from where it trained

    @property
    def tasks(self) -> dict[str, str]:
        """Task name -> task type, as the model serves them."""
        return {n: s.type for n, s in self.model.specs.items()}

    def predict(self, frame: Any) -> Any:
        """One output row per input row, in input order (see the module docstring)."""
        if "task" not in frame.columns:
            raise InputError(
                f"the input has no 'task' column (columns: {list(frame.columns)}); tasks served: {self.tasks}"
            )
        records = frame.to_dict("records")
        out: list[dict[str, Any]] = [{}] * len(records)
        by_task: dict[str, list[int]] = {}
        for i, rec in enumerate(records):
            task = rec.get("task")
            if task not in self.model.specs:
                raise InputError(f"row {i}: unknown task {task!r}; this model serves {self.tasks}")
            for field in INPUT_FIELDS[self.model.specs[task].type]:
                if not isinstance(rec.get(field), str) or not rec[field].strip():
                    raise InputError(
                        f"row {i} (task '{task}', {self.model.specs[task].type}): '{field}' must be a non-empty string, "
                        f"got {rec.get(field)!r}"
                    )
            by_task.setdefault(task, []).append(i)
        for task, rows in by_task.items():
            answers = self._answer(task, [records[i] for i in rows])
            for i, ans in zip(rows, answers, strict=True):
                out[i] = {c: None for c in OUTPUT_COLUMNS} | {"task": task} | ans
        return pd.DataFrame(
            out, columns=list(OUTPUT_COLUMNS), dtype=object
        )  # object: null stays None (JSON null), ints stay ints

    def _logits(self, task: str, cols: dict[str, list[Any]]) -> list[np.ndarray]:
        from datasets import Dataset

        from pipeline.modelling.multitask import predict_logits

        return predict_logits(
            self.model, task, Dataset.from_dict(cols), self.tok.pad_token_id, self.batch_size, self.precision
        )

    def _answer(self, task: str, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        spec = self.model.specs[task]
        if spec.type in ("sequence_classification", "pair_classification"):
            return self._classify(task, recs)
        if spec.type == "token_classification":
            return self._entities(task, recs)
        return self._answers(task, recs)

    def _classify(self, task: str, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        spec = self.model.specs[task]
        pairs = [r["text_pair"] for r in recs] if spec.type == "pair_classification" else None
        enc = self.tok(
            [r["text"] for r in recs],
            pairs,
            truncation="longest_first" if pairs else True,
            max_length=self.max_seq_length,
            return_token_type_ids=True,
        )
        out = []
        for lg in self._logits(task, {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"]}):
            p = softmax(lg)
            out.append({"label": spec.labels[int(p.argmax())], "score": float(p.max())})
        return out

    def _entities(self, task: str, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Words from :func:`split_words` (with character offsets), a tag per word from its first
        sub-token, entities from the BIO tags (``seqeval.get_entities``)."""
        from seqeval.metrics.sequence_labeling import get_entities

        spec = self.model.specs[task]
        words = [split_words(r["text"]) for r in recs]
        enc = self.tok(
            [[w for w, _ in ws] for ws in words],
            is_split_into_words=True,
            truncation=True,
            max_length=self.max_seq_length,
        )
        word_ids = [[-1 if w is None else w for w in enc.word_ids(i)] for i in range(len(recs))]
        out = []
        for rec, ws, wid, lg in zip(
            recs, words, word_ids, self._logits(task, {"input_ids": enc["input_ids"]}), strict=True
        ):
            probs = softmax(lg)
            tags, conf = ["O"] * len(ws), [1.0] * len(ws)  # words cut by truncation stay O
            seen: set[int] = set()
            for pos, w in enumerate(wid):
                if w >= 0 and w not in seen:
                    seen.add(w)
                    tags[w], conf[w] = spec.labels[int(probs[pos].argmax())], float(probs[pos].max())
            entities = []
            for etype, first, last in get_entities(tags):
                start, end = ws[first][1][0], ws[last][1][1]
                entities.append(
                    {
                        "type": etype,
                        "text": rec["text"][start:end],
                        "start": int(start),
                        "end": int(end),
                        "score": float(np.mean(conf[first : last + 1])),
                    }
                )
            out.append({"entities": entities})
        return out

    def _answers(self, task: str, recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from pipeline.tasks.encoding import qa_features

        spec = self.model.specs[task]
        enc = self.tok(
            [r["question"] for r in recs],
            [r["context"] for r in recs],
            truncation="only_second",
            max_length=self.max_seq_length,
            stride=self.doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_token_type_ids=True,
        )
        rows = [{"id": i, "context": r["context"], "answer_starts": [], "answer_texts": []} for i, r in enumerate(recs)]
        cols = qa_features(enc, rows, task)
        logits = self._logits(task, {k: cols[k] for k in ("input_ids", "token_type_ids")})
        feats = [
            {"offset_start": s, "offset_end": e, "example_id": x}
            for s, e, x in zip(cols["offset_start"], cols["offset_end"], cols["example_id"], strict=True)
        ]
        windows = example_windows(feats)
        out = []
        for row in rows:
            span = best_span(feats, logits, windows[row["id"]], row["context"], spec)
            out.append(
                {"answer": span.text, "score": span.probability, "answer_start": span.start, "answer_end": span.end}
            )
        return out


def requests_from_tasks(tasks_dir: Path, per_task: int) -> Any:
    """A request frame of the first ``per_task`` test examples of every task under ``data/tasks``."""
    import json

    import pyarrow.parquet as pq

    rows = []
    for meta_file in sorted(tasks_dir.glob("*/task.json")):
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        for r in pq.read_table(meta_file.parent / "test.parquet").slice(0, per_task).to_pylist():
            row: dict[str, Any] = {"task": meta["name"]}
            if meta["type"] == "token_classification":
                row["text"] = " ".join(r["tokens"])
            elif meta["type"] == "extractive_qa":
                row.update(question=r["question"], context=r["context"])
            else:
                row.update(text=r["text"], text_pair=r.get("text_pair"))
            rows.append(row)
    # optional columns no task uses are left out: an all-empty column is float NaN to pandas, which
    # MLflow's schema check rejects as a string column (found on the biomed profile: no pair or QA task)
    return pd.DataFrame(rows, columns=list(INPUT_COLUMNS)).dropna(axis=1, how="all")


def signature() -> Any:
    """Input: ``task`` plus the optional text columns; output: the answer columns (nullable)."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Object, Property, Schema

    inputs = Schema([ColSpec("string", "task")] + [ColSpec("string", c, required=False) for c in INPUT_COLUMNS[1:]])
    entity = Object(
        [
            Property("type", "string"),
            Property("text", "string"),
            Property("start", "long"),
            Property("end", "long"),
            Property("score", "double"),
        ]
    )
    outputs = Schema(
        [
            ColSpec("string", "task"),
            ColSpec("string", "label", required=False),
            ColSpec("double", "score", required=False),
            ColSpec(Array(entity), "entities", required=False),
            ColSpec("string", "answer", required=False),
            ColSpec("long", "answer_start", required=False),
            ColSpec("long", "answer_end", required=False),
        ]
    )
    return ModelSignature(inputs=inputs, outputs=outputs)
