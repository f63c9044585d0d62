"""What a task type is: the one interface every stage goes through, and the pieces types share.

A task type is one module under ``pipeline/tasks/`` holding one :class:`TaskType` subclass, listed
once in :mod:`pipeline.tasks.registry`. The class says everything a type needs, from the file
fields a user maps to their columns to the JSON a served model answers with; ingest, validate,
tokenize, finetune, evaluate, register and serving only ever call these methods, never switch on
the type's name. Torch is imported inside the methods that need it: the config parser reads the
registry (field names, metric names) and must stay fast to import.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.core.errors import DataError, shorten
from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.text.readers import required_field
from pipeline.text.textnorm import NormalForm, normalize_text

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pipeline.core.sections.tokenize import TokenizeConfig
    from pipeline.tasks.spec import TaskSpec

Row = dict[str, Any]  # one normalised task example (ingest's Parquet row)


@dataclass(frozen=True)
class Record:
    """A raw task record being normalised by ingest: its fields by logical name, and where it was read."""

    raw: dict[str, Any]
    column: Callable[[str], str]  # logical field -> the column name in the user's files (``fields:``)
    path: Path
    line: int
    form: NormalForm  # Unicode normalisation form

    def error(self, rule: str, message: str) -> DataError:
        return DataError(self.path, self.line, rule, message)

    def has(self, key: str) -> bool:
        """The field is present and not null."""
        return self.raw.get(self.column(key)) is not None

    def value(self, key: str) -> Any:
        """The field's raw value; a missing or null field is a :class:`DataError`."""
        return required_field(self.raw, self.column(key), self.path, self.line)

    def text(self, key: str) -> str:
        """A string field, Unicode-normalised."""
        value = self.value(key)
        if not isinstance(value, str):
            raise self.error("wrong-type", f"field '{self.column(key)}' must be a string, got {type(value).__name__}")
        return normalize_text(value, self.form)

    def label(self, value: Any, key: str) -> str:
        """A label value (string or integer) as a string."""
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(
                "wrong-type",
                f"field '{self.column(key)}' must be a string or integer label, got {type(value).__name__}",
            )
        return str(value)

    def normalize(self, text: str) -> str:
        return normalize_text(text, self.form)


@dataclass(frozen=True)
class Mistake:
    """One test example a model got wrong, as the error analysis shows it (:mod:`pipeline.tasks.errors`)."""

    gold: str  # the right answer, in words (for NER and multi-label: only the parts that were wrong)
    pred: str  # what the model answered, likewise
    confidence: float | None  # the model's probability for what it answered there (None: the type has none)
    rank: float  # higher = more confidently wrong (regression: further off); the analysis lists the highest
    confusions: tuple[tuple[str, str], ...]  # the (gold, predicted) label pairs it adds to the confusion table


@dataclass
class Check:
    """One validation expectation on a frame, with the plain-words rule it enforces."""

    expectation: Any  # a gx.expectations.* instance
    rule: str  # shown in the summary and as the GX description
    preview: tuple[str, ...]  # columns shown for offending records


class TaskType:
    """Everything adaptbert knows about one task type. Subclasses set the class attributes and
    implement the methods; the defaults here are those of single-label classification over texts."""

    name: ClassVar[str]
    fields: ClassVar[dict[str, str]]  # logical field -> default column name; users remap with ``fields:``
    optional_fields: ClassVar[frozenset[str]] = frozenset()  # may be absent from a record
    columns: ClassVar[tuple[str, ...]]  # ingest's normalised Parquet columns (besides id and source)
    metrics: ClassVar[tuple[str, ...]]  # selectable primary metrics, the default first; higher is better
    trivial_name: ClassVar[str]
    hub_task: ClassVar[str] = "text-classification"  # the Hugging Face Hub's task type (a model card's model-index)
    labelled: ClassVar[bool] = True  # has a label map (and its head one output per label)
    min_labels: ClassVar[int] = 2  # labels given in params need at least this many
    windowed: ClassVar[bool] = False  # long inputs become several windows (features != examples)
    long_text_windows: ClassVar[bool] = False  # finetune.tasks.<name>.long_text: windows is allowed (see encode_long)
    decode_reads_features: ClassVar[bool] = False  # decoding needs word ids / offsets, not just logits
    graded: ClassVar[bool] = False  # answers are near or far, never right or wrong (regression): no error count
    request_fields: ClassVar[tuple[str, ...]]  # serving: required input columns
    optional_request_fields: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ data: ingest and validate

    def normalize(self, rec: Record) -> Row:
        """One raw record in this type's normalised schema (:attr:`columns`)."""
        raise NotImplementedError

    def label_list(self, train: Sequence[Row]) -> list[str]:
        """The label map frozen from the train split when params give none."""
        return sorted({row["label"] for row in train})

    def input_texts(self, row: Row) -> list[str]:
        """The model-input texts of one row, without its label (TAPT corpus, overlap checks, vocab mining)."""
        return [row["text"]]

    def leakage_texts(self, row: Row) -> list[str]:
        """Texts of an evaluation row that must not appear inside pretraining documents."""
        return self.input_texts(row)

    def checks(self, df: Any, labels: list[str], split: str, E: Any) -> list[Check]:
        """GX checks of one split's frame (derived columns may be added to ``df`` in place)."""
        raise NotImplementedError

    def label_counts(self, train: Any) -> Counter[str] | None:
        """Train examples per label for the per-label minimum check; ``None`` when the type has no labels."""
        return Counter(train["label"])

    # ------------------------------------------------------------------ model inputs

    def encode(
        self, tok: Any, rows: Sequence[Row], labels: list[str], tc: TokenizeConfig, task: str
    ) -> dict[str, list]:
        """Model inputs for one split, batch-encoded (never one text at a time)."""
        raise NotImplementedError

    def encode_long(
        self, tok: Any, rows: Sequence[Row], labels: list[str], tc: TokenizeConfig, task: str, max_windows: int
    ) -> dict[str, list]:
        """``long_text: windows``: each example as up to ``max_windows`` overlapping windows (one row per example,
        ``input_ids`` a list of windows), for types with :attr:`long_text_windows`."""
        raise NotImplementedError(f"{self.name} has no windows for long texts")

    def make_head(self, hidden: int, spec: TaskSpec, dropout: float) -> nn.Module:
        from pipeline.modelling.heads import ClassificationHead

        return ClassificationHead(hidden, spec.num_labels, spec.settings.pooling, dropout)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor], weight: torch.Tensor | None) -> torch.Tensor:
        from torch import nn

        return nn.functional.cross_entropy(logits.float(), batch["labels"], weight=weight)

    def distill_loss(
        self, student: torch.Tensor, teacher: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float
    ) -> torch.Tensor:
        """The soft-target loss of a student's logits against a teacher's (Hinton et al. 2015).

        KL(teacher || student) of the temperature-softened label distributions, times T^2 so its
        gradients keep their scale as T changes. ``batch`` is the collated batch (masks, labels).
        """
        return soft_cross_entropy(student, teacher, temperature, dim=-1)

    def collate(self, features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
        return pad_features(features, pad_id)

    def balanced_weights(self, train_labels: Sequence[Any], spec: TaskSpec) -> torch.Tensor | None:
        """``class_weights: balanced``: the loss weights from the train labels (``None``: the type has none)."""
        return class_weights(train_labels, spec.num_labels) if self.labelled else None

    # ------------------------------------------------------------------ scoring

    def decode(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list:
        """One prediction per example from its features' logits."""
        return [int(np.argmax(lg)) for lg in logits]

    def gold(self, rows: Sequence[Row], spec: TaskSpec) -> list:
        index = {label: i for i, label in enumerate(spec.labels)}
        return [index[r["label"]] for r in rows]

    def trivial(self, train: Sequence[Row], rows: Sequence[Row], spec: TaskSpec) -> list:
        """The trivial baseline's predictions (here: the majority train class)."""
        top = Counter(r["label"] for r in train).most_common(1)[0][0]
        return [spec.labels.index(top)] * len(rows)

    def score(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
        """Every metric of the type (the primary ones and any breakdown)."""
        raise NotImplementedError

    def stats(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
        """Per-example sufficient statistics: the metrics of any resample are a function of their weighted sum."""
        raise NotImplementedError

    def from_stats(self, summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
        """The primary metrics from summed :meth:`stats` (the paired bootstrap's inner loop)."""
        raise NotImplementedError

    def confusion(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> list[list[int]] | None:
        """A confusion matrix for the report, where the type has one."""
        return None

    # ------------------------------------------------------------------ error analysis

    def confidences(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list[Any]:
        """Per example, the model's probability for the answer :meth:`decode` gives (here: the top class's softmax
        probability; types that answer in parts give one per part, types without probabilities ``None``)."""
        return [float(softmax(np.asarray(lg, dtype=np.float64)).max()) for lg in logits]

    def shown_input(self, row: Row) -> str:
        """The example's input as a person reads it in the error analysis (texts of a pair joined by ``||``)."""
        return " || ".join(self.input_texts(row))

    def shown_answer(self, row: Row, answer: Any, spec: TaskSpec) -> str:
        """A gold or predicted answer of ``row`` in words (the predictions file)."""
        return str(spec.labels[answer])

    def mistake(self, row: Row, gold: Any, pred: Any, confidence: Any, spec: TaskSpec) -> Mistake | None:
        """What is wrong with ``pred`` (``None``: it is right)."""
        if gold == pred:
            return None
        g, p = spec.labels[gold], spec.labels[pred]
        return Mistake(g, p, confidence, confidence, ((g, p),))

    def seen_unseen(
        self, train: Sequence[Row], rows: Sequence[Row], gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec
    ) -> dict[str, dict[str, float]] | None:
        """Scores split by whether the answer's surface form occurs in the train split (``None``: the type has no
        such split; token classification: entity mentions seen or unseen in train)."""
        return None

    # ------------------------------------------------------------------ serving

    def request_row(self, row: Row) -> dict[str, Any]:
        """A serving request built from a normalised example (smoke tests, the registry's input example)."""
        return {f: row[f] for f in self.request_fields + self.optional_request_fields if row.get(f) is not None}

    def request_problem(self, tok: Any, max_seq_length: int, doc_stride: int, rec: dict[str, Any]) -> str | None:
        """Why this type cannot answer a request row whose fields are present (``None``: it can): checked before any
        row is encoded, so a bad row is a 400 naming it, never an exception inside the model."""
        return None

    def output_schema(self) -> list[Any]:
        """MLflow ``ColSpec`` s of the answer columns this type fills (all optional in the served signature)."""
        raise NotImplementedError

    def serve(self, predictor: Any, spec: TaskSpec, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Answers to raw-text requests; ``predictor`` gives ``tok``, ``max_seq_length``, ``doc_stride`` and
        ``logits(task, columns)`` (see :class:`pipeline.serving.service.Predictor`)."""
        raise NotImplementedError


# ----------------------------------------------------------------------------- shared pieces

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
    import torch

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


def collate_windows(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Examples of several windows each (``long_text: windows``): every window a padded row, plus
    ``window_example`` (which example each row belongs to) for the model to aggregate their logits."""
    import torch

    rows, owner = [], []
    for i, f in enumerate(features):
        for w, ids in enumerate(f["input_ids"]):
            row = {"input_ids": ids}
            if "token_type_ids" in f:
                row["token_type_ids"] = f["token_type_ids"][w]
            rows.append(row)
            owner.append(i)
    batch = pad_features(rows, pad_id)
    if "labels" in features[0]:
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)
    batch["window_example"] = torch.tensor(owner, dtype=torch.long)
    return batch


def is_windowed(features: Sequence[dict[str, Any]]) -> bool:
    """Rows whose ``input_ids`` are lists of windows (``long_text: windows``) rather than one token list."""
    return bool(features) and bool(features[0]["input_ids"]) and isinstance(features[0]["input_ids"][0], list)


def pad_with_float_labels(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """:func:`pad_features` for targets that are floats per example (a score, or a multi-hot label vector)."""
    import torch

    batch = pad_features([{k: v for k, v in f.items() if k != "labels"} for f in features], pad_id)
    if "labels" in features[0]:
        batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.float32)
    return batch


def class_weights(labels: Sequence[Any], num_labels: int) -> torch.Tensor:
    """scikit-learn's ``balanced`` weights n / (k * count_c) from the train labels (ignored positions dropped).

    A label absent from train (allowed when the label list is fixed in params) gets weight 1.
    """
    import torch
    from sklearn.utils.class_weight import compute_class_weight

    flat = np.array([x for row in labels for x in (row if isinstance(row, list) else [row]) if x != IGNORE_INDEX])
    present = np.unique(flat)
    weights = np.ones(num_labels)
    weights[present] = compute_class_weight("balanced", classes=present, y=flat)
    return torch.tensor(weights, dtype=torch.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def label_ids(rows: Sequence[Row], key: str, label2id: dict[str, int], task: str) -> list[int]:
    """The label of each row as its id; a label outside the map names the record."""
    out = []
    for r in rows:
        if r[key] not in label2id:
            raise DataError(
                r["source_file"],
                r["source_line"],
                "unknown-label",
                f"task '{task}': label '{r[key]}' is not in its label map {shorten(list(label2id))}",
            )
        out.append(label2id[r[key]])
    return out


def text_checks(E: Any, columns: Sequence[str]) -> list[Check]:
    """No null and no empty value in each text column."""
    checks = []
    for col in columns:
        checks.append(Check(E.ExpectColumnValuesToNotBeNull(column=col), f"no null {col}", (col,)))
        checks.append(Check(E.ExpectColumnValueLengthsToBeBetween(column=col, min_value=1), f"no empty {col}", (col,)))
    return checks


def classifier_outputs(tok: Any, rows: Sequence[Any], max_len: int, pair_key: str | None) -> dict[str, list]:
    """``input_ids`` and ``token_type_ids`` of texts (and their pairs, when ``pair_key`` names the field)."""
    pairs = [r[pair_key] for r in rows] if pair_key else None
    enc = tok(
        [r["text"] for r in rows],
        pairs,
        truncation="longest_first" if pairs else True,
        max_length=max_len,
        return_token_type_ids=True,
    )
    if not pairs:  # one segment: token types are all 0, which BERT assumes when they are not given
        return {"input_ids": enc["input_ids"]}
    return {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"]}


def classifier_windows(
    tok: Any, rows: Sequence[Any], max_len: int, stride: int, pair_key: str | None, max_windows: int
) -> dict[str, list]:
    """Overlapping windows of each text (``stride`` tokens shared by neighbours, as QA's doc-stride windows),
    at most ``max_windows`` per example; with a pair, the first text is windowed and the second kept whole in each.

    Returns one row per example: ``input_ids`` (and ``token_type_ids``) as lists of windows, and
    ``window_count``, the windows the text needed (more than ``max_windows``: its tail was dropped).
    """
    pairs = [r[pair_key] for r in rows] if pair_key else None
    try:
        enc = tok(
            [r["text"] for r in rows],
            pairs,
            truncation="only_first" if pairs else True,
            max_length=max_len,
            stride=stride,
            return_overflowing_tokens=True,
            return_token_type_ids=True,
        )
    except Exception as err:  # the tokenizer's Rust error names no record: find the one it could not window
        raise _unwindowable(tok, rows, max_len, stride, pair_key, err) from None
    ids: list[list[list[int]]] = [[] for _ in rows]
    types: list[list[list[int]]] = [[] for _ in rows]
    counts = [0] * len(rows)
    for i, example in enumerate(enc["overflow_to_sample_mapping"]):
        counts[example] += 1
        if len(ids[example]) < max_windows:
            ids[example].append(enc["input_ids"][i])
            types[example].append(enc["token_type_ids"][i])
    out: dict[str, list] = {"input_ids": ids, "window_count": counts}
    if pairs:
        out["token_type_ids"] = types
    return out


def _unwindowable(
    tok: Any, rows: Sequence[Any], max_len: int, stride: int, pair_key: str | None, err: Exception
) -> Exception:
    for r in rows:
        try:
            tok(
                r["text"],
                r[pair_key] if pair_key else None,
                truncation="only_first" if pair_key else True,
                max_length=max_len,
                stride=stride,
                return_overflowing_tokens=True,
            )
        except Exception:
            if "source_file" not in r:  # a served request: the caller names it
                return ValueError(f"'{pair_key}' leaves no room for a window of the text within {max_len} tokens")
            return DataError(
                r["source_file"],
                r["source_line"],
                "pair-too-long",
                f"'{pair_key}' is too long to window the text beside it within max_seq_length {max_len} "
                f"(doc_stride {stride}): shorten it or raise tokenize.max_seq_length",
            )
    return err


def soft_cross_entropy(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float, dim: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher/T) || softmax(student/T))`` over ``dim``, averaged over the rest (or ``mask``)."""
    from torch import nn

    t = temperature
    log_p = nn.functional.log_softmax(student.float() / t, dim=dim)
    q = nn.functional.softmax(teacher.float() / t, dim=dim)
    kl = nn.functional.kl_div(log_p, q, reduction="none").sum(dim)  # kl_div(input=log p, target=q): q log(q/p)
    if mask is not None:
        kl = kl[mask]
    return kl.mean() * t * t if kl.numel() else student.sum() * 0.0
