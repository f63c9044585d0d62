"""Extractive QA (SQuAD layout): an answer span in a context, over doc-stride windows of long contexts."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.core.errors import DataError
from pipeline.tasks.base import Check, Mistake, Record, Row, TaskType, soft_cross_entropy
from pipeline.tasks.metrics import qa_example_scores, qa_from_stats, qa_metrics, qa_stats
from pipeline.text.textnorm import normalize_with_spans

if TYPE_CHECKING:
    from pipeline.tasks.spec import TaskSpec


def _offset(value: Any, rec: Record) -> int:
    """An answer offset: an integer (or an integral float such as 12.0), never negative."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise rec.error(
            "wrong-type", f"answers.answer_start must hold non-negative integers (character offsets), got {value!r}"
        )
    return value


def answers_at_offsets(context: str, texts: list[str], starts: list[int]) -> bool:
    """Every answer text is found in the context exactly at its start offset."""
    if len(texts) != len(starts):
        return False
    return all(s >= 0 and context[s : s + len(t)] == t and t for t, s in zip(texts, starts, strict=True))


def qa_features(enc: Any, rows: Sequence[Row], task: str) -> dict[str, list[Any]]:
    """Windows of (question, context) with start/end token positions; CLS (0) when the answer is outside.

    Follows the HF ``run_qa`` recipe: ``overflow_to_sample_mapping`` ties each window to its
    example, offsets are kept for context tokens only (-1 elsewhere) to map predictions back.
    """
    keys = (
        "input_ids",
        "token_type_ids",
        "offset_start",
        "offset_end",
        "example_id",
        "start_positions",
        "end_positions",
    )
    cols: dict[str, list[Any]] = {k: [] for k in keys}
    for i in range(len(enc["input_ids"])):
        row = rows[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        offsets = enc["offset_mapping"][i]
        ctx = [j for j, s in enumerate(seq) if s == 1]
        start_tok = end_tok = 0
        if row["answer_starts"]:
            a_start = int(row["answer_starts"][0])
            a_end = a_start + len(row["answer_texts"][0])
            if a_start < 0 or a_end > len(row["context"]) or not row["answer_texts"][0]:
                raise DataError(
                    row["source_file"],
                    row["source_line"],
                    "answer-outside-context",
                    f"task '{task}': answer [{a_start}, {a_end}) lies outside its context of {len(row['context'])} characters",
                )
            if ctx and offsets[ctx[0]][0] <= a_start and offsets[ctx[-1]][1] >= a_end:
                start_tok = next(j for j in ctx if offsets[j][1] > a_start)
                end_tok = next(j for j in reversed(ctx) if offsets[j][0] < a_end)
        cols["input_ids"].append(enc["input_ids"][i])
        cols["token_type_ids"].append(enc["token_type_ids"][i])
        cols["offset_start"].append([o[0] if s == 1 else -1 for o, s in zip(offsets, seq, strict=True)])
        cols["offset_end"].append([o[1] if s == 1 else -1 for o, s in zip(offsets, seq, strict=True)])
        cols["example_id"].append(row["id"])
        cols["start_positions"].append(start_tok)
        cols["end_positions"].append(end_tok)
    return cols


def encode_windows(tok: Any, rows: Sequence[Row], max_len: int, stride: int, task: str) -> dict[str, list[Any]]:
    """Doc-stride windows of every (question, context) row (training, scoring and serving alike)."""
    enc = tok(
        [r["question"] for r in rows],
        [r["context"] for r in rows],
        truncation="only_second",
        max_length=max_len,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
    )
    return qa_features(enc, rows, task)


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
        top_s, top_e = np.argsort(start_logits)[::-1][:n_best], np.argsort(end_logits)[::-1][:n_best]
        # every (start, end) pair of the two top lists at once; row-major argmax = the first best pair in the order
        # a loop over starts, then ends, would meet it
        scores = start_logits[top_s][:, None] + end_logits[top_e][None, :]
        length = top_e[None, :] - top_s[:, None] + 1
        valid = (starts_ok[top_s] >= 0)[:, None] & (ends_ok[top_e] >= 0)[None, :] & (length >= 1) & (length <= max_len)
        if not valid.any():
            continue
        k = int(np.argmax(np.where(valid, scores, -np.inf)))
        s, e = int(top_s[k // len(top_e)]), int(top_e[k % len(top_e)])
        score = float(scores.flat[k])
        if score > best.score:
            best, best_window = Span(context[starts_ok[s] : ends_ok[e]], int(starts_ok[s]), int(ends_ok[e]), score), i
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


class ExtractiveQA(TaskType):
    name = "extractive_qa"
    fields: ClassVar[dict[str, str]] = {"question": "question", "context": "context", "answers": "answers"}
    columns = ("question", "context", "answer_texts", "answer_starts", "answer_starts_in_file")
    metrics = ("f1", "exact_match")
    trivial_name = "most frequent train answer"
    hub_task = "question-answering"
    labelled = False
    min_labels = 0
    windowed = True
    decode_reads_features = True
    request_fields = ("question", "context")

    def normalize(self, rec: Record) -> Row:
        """SQuAD layout: ``answers = {"text": [...], "answer_start": [...]}``; offsets follow normalisation."""
        answers = rec.value("answers")
        if not (
            isinstance(answers, dict)
            and isinstance(answers.get("text"), list)
            and isinstance(answers.get("answer_start"), list)
        ):
            raise rec.error("wrong-type", "answers must be {'text': [...], 'answer_start': [...]} (SQuAD layout)")
        raw_context = rec.value("context")
        if not isinstance(raw_context, str):
            raise rec.error("wrong-type", "context must be a string")
        if len(answers["text"]) != len(answers["answer_start"]):
            raise rec.error(
                "unequal-lengths",
                f"answers.text has {len(answers['text'])} entries and answers.answer_start "
                f"{len(answers['answer_start'])}; one offset per answer",
            )
        if not all(isinstance(t, str) for t in answers["text"]):
            raise rec.error("wrong-type", "answers.text must hold strings")
        texts = list(answers["text"])
        starts = [_offset(s, rec) for s in answers["answer_start"]]
        spans = [(s, s + len(t)) for s, t in zip(starts, texts, strict=False)]
        context, mapped = normalize_with_spans(raw_context, spans, rec.form)
        return {
            "question": rec.text("question"),
            "context": context,
            "answer_texts": [rec.normalize(t) for t in texts],
            "answer_starts": [s for s, _ in mapped],
            "answer_starts_in_file": starts,
        }  # as the file gave them: what validate shows a user

    def label_list(self, train: Sequence[Row]) -> list[str]:
        return []

    def input_texts(self, row: Row) -> list[str]:
        return [row["question"], row["context"]]

    def leakage_texts(self, row: Row) -> list[str]:
        return [row["context"]]  # questions are short and generic ("What does X inhibit?")

    def checks(self, df: Any, labels: list[str], split: str, E: Any) -> list[Check]:
        df["answer_at_offset"] = [
            answers_at_offsets(c, list(a), list(s))
            for c, a, s in zip(df["context"], df["answer_texts"], df["answer_starts"], strict=True)
        ]
        checks = [
            Check(E.ExpectColumnValueLengthsToBeBetween(column=col, min_value=1), f"no empty {col}", (col,))
            for col in ("question", "context")
        ]
        checks.append(
            Check(
                E.ExpectColumnValuesToBeInSet(column="answer_at_offset", value_set=[True]),
                "every answer is found at its answer_start in the context",
                ("answer_texts", "answer_starts_in_file", "answer_starts", "question"),
            )
        )
        return checks

    def label_counts(self, train: Any) -> None:
        return None

    def encode(self, tok: Any, rows: Sequence[Row], labels: list[str], tc: Any, task: str) -> dict[str, list]:
        return encode_windows(tok, rows, tc.max_seq_length, tc.doc_stride, task)

    def make_head(self, hidden: int, spec: TaskSpec, dropout: float) -> Any:
        from pipeline.modelling.heads import SpanHead

        return SpanHead(hidden)

    def loss(self, logits: Any, batch: dict[str, Any], weight: Any) -> Any:
        from torch import nn

        start, end = logits.float().unbind(-1)
        return (
            nn.functional.cross_entropy(start, batch["start_positions"])
            + nn.functional.cross_entropy(end, batch["end_positions"])
        ) / 2

    def distill_loss(self, student: Any, teacher: Any, batch: dict[str, Any], temperature: float) -> Any:
        """Soft targets over token positions, for the start and the end distribution (padding carries ~0 mass)."""
        return soft_cross_entropy(student, teacher, temperature, dim=1)

    def decode(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list:
        """The answer text of every example (:func:`best_span` over its windows)."""
        windows = example_windows(features)
        return [best_span(features, logits, windows[row["id"]], row["context"], spec).text for row in rows]

    def gold(self, rows: Sequence[Row], spec: TaskSpec) -> list:
        return [list(r["answer_texts"]) for r in rows]

    def confidences(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list[Any]:
        """The chosen span's probability (start times end softmax in its window, as served)."""
        windows = example_windows(features)
        return [best_span(features, logits, windows[row["id"]], row["context"], spec).probability for row in rows]

    def shown_answer(self, row: Row, answer: Any, spec: TaskSpec) -> str:
        texts = answer if isinstance(answer, list) else [answer]
        return " | ".join(t for t in texts if t) or "(no answer)"

    def mistake(self, row: Row, gold: Any, pred: Any, confidence: Any, spec: TaskSpec) -> Mistake | None:
        """Not an exact match of any gold answer (SQuAD's normalisation)."""
        em, _ = qa_example_scores([gold], [pred])
        if em[0] == 1.0:
            return None
        return Mistake(self.shown_answer(row, gold, spec), pred or "(no answer)", confidence, confidence, ())

    def trivial(self, train: Sequence[Row], rows: Sequence[Row], spec: TaskSpec) -> list:
        top = Counter(r["answer_texts"][0] for r in train if r["answer_texts"]).most_common(1)
        return [top[0][0] if top else ""] * len(rows)

    def score(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
        return qa_metrics(gold, pred)

    def stats(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
        return qa_stats(gold, pred)

    def from_stats(self, summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
        return qa_from_stats(summed)

    def output_schema(self) -> list[Any]:
        from mlflow.types.schema import ColSpec

        return [
            ColSpec("string", "answer", required=False),
            ColSpec("double", "score", required=False),
            ColSpec("long", "answer_start", required=False),
            ColSpec("long", "answer_end", required=False),
        ]

    def request_problem(self, tok: Any, max_seq_length: int, doc_stride: int, rec: dict[str, Any]) -> str | None:
        # every window holds the whole question, 3 special tokens and more context tokens than the stride (the
        # tokenizer panics otherwise): the longest question a window leaves room for
        longest = max_seq_length - 3 - doc_stride - 1
        n = len(tok(rec["question"], add_special_tokens=False)["input_ids"])
        if n > longest:
            return (
                f"'question' is {n} tokens; a window of {max_seq_length} tokens with a stride of {doc_stride} "
                f"leaves room for at most {longest}"
            )
        return None

    def serve(self, predictor: Any, spec: TaskSpec, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = [
            {"id": i, "context": r["context"], "question": r["question"], "answer_starts": [], "answer_texts": []}
            for i, r in enumerate(recs)
        ]
        cols = encode_windows(predictor.tok, rows, predictor.max_seq_length, predictor.doc_stride, spec.name)
        logits = predictor.logits(spec.name, {k: cols[k] for k in ("input_ids", "token_type_ids")})
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
