"""Token classification (NER): a BIO tag per word, scored on entities (seqeval, strict IOB2)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.core.errors import DataError, shorten
from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.tasks.base import Check, Mistake, Record, Row, TaskType, soft_cross_entropy
from pipeline.tasks.metrics import entity_from_stats, entity_metrics, entity_spans, entity_stats
from pipeline.text.words import split_words

if TYPE_CHECKING:
    from pipeline.tasks.spec import TaskSpec


def bio_is_valid(tags: list[str]) -> bool:
    """Strict IOB2: every ``I-X`` follows ``B-X`` or ``I-X``."""
    prev = "O"
    for tag in tags:
        if tag.startswith("I-"):
            if prev[2:] != tag[2:] or prev == "O":
                return False
        elif tag != "O" and not tag.startswith("B-"):
            return False
        prev = tag
    return True


def align_token_labels(
    word_ids: list[int | None], tags: list[int], label_all: bool, b_to_i: dict[int, int]
) -> list[int]:
    """NER labels per sub-token: the word's tag on its first piece; the rest -100 (or I-X if label_all)."""
    labels = []
    prev = None
    for w in word_ids:
        if w is None:
            labels.append(IGNORE_INDEX)
        elif w != prev:
            labels.append(tags[w])
        else:
            labels.append(b_to_i.get(tags[w], tags[w]) if label_all else IGNORE_INDEX)
        prev = w
    return labels


def first_subtoken_positions(word_ids: Sequence[int], n_words: int) -> list[int]:
    """The position of each word's first sub-token; -1 for a word with none (cut by truncation)."""
    positions = [-1] * n_words
    for pos, w in enumerate(word_ids):
        if 0 <= w < n_words and positions[w] < 0:
            positions[w] = pos
    return positions


def bio_viterbi(log_probs: np.ndarray, labels: Sequence[str]) -> list[int]:
    """The most probable tag sequence that is valid IOB2 (no ``I-X`` first, after ``O`` or after another type).

    ``log_probs``: (words, labels) log-probabilities, each word scored alone. Word-wise argmax can emit ``O I-X``,
    which strict IOB2 scoring (and serving's entity spans) then drop or cut; a linear chain with those transitions
    forbidden keeps the model's best *valid* reading (the constrained decoding of e.g. AllenNLP's
    ``allowed_transitions``, here with no learned transition scores: numpy, (words x labels^2) work).
    """
    n, k = log_probs.shape
    if n == 0:
        return []
    inside = np.array([t.startswith("I-") for t in labels])
    # allowed[a, b]: tag b may follow tag a; I-X only after B-X or I-X
    allowed = ~inside[None, :] | np.array([[a != "O" and a[2:] == b[2:] for b in labels] for a in labels])
    trans = np.where(allowed, 0.0, -np.inf)
    score = np.where(inside, -np.inf, log_probs[0])
    back = np.zeros((n, k), dtype=np.int64)
    for t in range(1, n):
        cand = score[:, None] + trans
        back[t] = cand.argmax(axis=0)
        score = cand.max(axis=0) + log_probs[t]
    path = [int(score.argmax())]
    for t in range(n - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return path[::-1]


def word_tags(
    word_ids: Sequence[int], logits: np.ndarray, n_words: int, labels: Sequence[str], decoding: str
) -> tuple[list[str], list[float]]:
    """A tag per word from its first sub-token's logits (``viterbi``: the best valid IOB2 sequence; ``argmax``: each
    word's most probable tag) and the model's probability of that tag. A word cut by truncation is ``O`` with
    probability 1.0 (no guess of the model's)."""
    positions = first_subtoken_positions(word_ids, n_words)
    scored = [w for w, p in enumerate(positions) if p >= 0]
    tags, conf = ["O"] * n_words, [1.0] * n_words
    if not scored:
        return tags, conf
    z = np.asarray(logits, dtype=np.float64)[[positions[w] for w in scored]]
    log_probs = z - z.max(axis=-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(axis=-1, keepdims=True))
    if decoding == "viterbi":
        chain = np.zeros((scored[-1] + 1, len(labels)))  # a word with no sub-token (inside the sentence) is O
        chain[:, [t != "O" for t in labels]] = -np.inf if "O" in labels else 0.0
        chain[scored] = log_probs
        ids = [bio_viterbi(chain, labels)[w] for w in scored]
    else:
        ids = [int(i) for i in log_probs.argmax(axis=-1)]
    for j, (w, i) in enumerate(zip(scored, ids, strict=True)):
        tags[w], conf[w] = labels[i], float(np.exp(log_probs[j, i]))
    return tags, conf


def mention(tokens: Sequence[str], start: int, end: int) -> str:
    """An entity's words, lower-cased: what "seen in train" compares."""
    return " ".join(tokens[start:end]).lower()


def entities_text(tokens: Sequence[str], spans: Sequence[tuple[int, int, str]]) -> str:
    """``type: words`` of each entity, ``; ``-separated."""
    return "; ".join(f"{t}: {' '.join(tokens[s:e])}" for s, e, t in spans)


def prf(c: Counter[str]) -> dict[str, float]:
    """Precision, recall, F1 and the counts of one group of mentions."""
    precision = c["correct"] / c["predicted"] if c["predicted"] else 0.0
    recall = c["correct"] / c["gold"] if c["gold"] else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "gold": c["gold"], "predicted": c["predicted"]}


class TokenClassification(TaskType):
    name = "token_classification"
    fields: ClassVar[dict[str, str]] = {"tokens": "tokens", "tags": "tags"}
    columns = ("tokens", "tags")
    metrics = ("f1", "precision", "recall")
    trivial_name = "all O"
    hub_task = "token-classification"
    min_labels = 0
    decode_reads_features = True
    request_fields = ("text",)  # raw text, split into words as NER files are (pipeline.text.words)

    def normalize(self, rec: Record) -> Row:
        tokens, tags = rec.value("tokens"), rec.value("tags")
        if not (isinstance(tokens, list) and isinstance(tags, list)):
            raise rec.error("wrong-type", "tokens and tags must be lists")
        for i, tok in enumerate(tokens):  # str(None) would become the word "None", str(5) silently "5"
            if not isinstance(tok, str):
                raise rec.error(
                    "wrong-type",
                    f"token {i} of field '{rec.column('tokens')}' must be a string, got {type(tok).__name__} {tok!r}",
                )
        pairs = [(rec.normalize(tok), rec.label(tag, "tags")) for tok, tag in zip(tokens, tags, strict=False)]
        # tokens that normalise to nothing (e.g. a lone zero-width space) go with their tag;
        # unequal list lengths are kept visible for validate to report.
        kept = [(tok, tag) for tok, tag in pairs if tok]
        extra_tags = [str(t) for t in tags[len(tokens) :]]
        extra_tokens = [rec.normalize(t) for t in tokens[len(tags) :]]
        return {"tokens": [t for t, _ in kept] + extra_tokens, "tags": [g for _, g in kept] + extra_tags}

    def label_list(self, train: Sequence[Row]) -> list[str]:
        seen = {t for row in train for t in row["tags"]}
        return sorted(seen, key=lambda t: (t != "O", t[2:], t))

    def input_texts(self, row: Row) -> list[str]:
        return [" ".join(row["tokens"])]

    def checks(self, df: Any, labels: list[str], split: str, E: Any) -> list[Check]:
        df["n_tokens"] = df["tokens"].map(len)
        df["n_tags"] = df["tags"].map(len)
        df["bio_valid"] = df["tags"].map(lambda tags: bio_is_valid(list(tags)))
        df["unknown_tags"] = df["tags"].map(lambda tags: sum(tag not in labels for tag in tags))
        df["text"] = df["tokens"].map(lambda toks: " ".join(toks))
        df["tag_seq"] = df["tags"].map(lambda tags: " ".join(tags))
        return [
            Check(E.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=1), "no empty sentence", ("text",)),
            Check(
                E.ExpectColumnPairValuesToBeEqual(column_A="n_tokens", column_B="n_tags"),
                "token and tag lists of equal length",
                ("n_tokens", "n_tags", "text"),
            ),
            Check(
                E.ExpectColumnValuesToBeInSet(column="bio_valid", value_set=[True]),
                "valid BIO: every I-X follows B-X or I-X",
                ("tag_seq", "text"),
            ),
            Check(
                E.ExpectColumnValuesToBeBetween(column="unknown_tags", max_value=0),
                f"tags within the tag set {shorten(labels)}",
                ("tag_seq",),
            ),
        ]

    def label_counts(self, train: Any) -> Counter[str]:
        return Counter(tag for tags in train["tags"] for tag in tags)

    def encode(self, tok: Any, rows: Sequence[Row], labels: list[str], tc: Any, task: str) -> dict[str, list]:
        label2id = {lbl: i for i, lbl in enumerate(labels)}
        tags = []
        for r in rows:
            unknown = [t for t in r["tags"] if t not in label2id]
            if unknown:
                raise DataError(
                    r["source_file"],
                    r["source_line"],
                    "unknown-label",
                    f"task '{task}': tag '{unknown[0]}' is not in its label map {shorten(labels)}",
                )
            tags.append([label2id[t] for t in r["tags"]])
        b_to_i = {
            label2id[t]: label2id["I-" + t[2:]] for t in labels if t.startswith("B-") and "I-" + t[2:] in label2id
        }
        enc = tok(
            [list(r["tokens"]) for r in rows], is_split_into_words=True, truncation=True, max_length=tc.max_seq_length
        )
        word_ids = [enc.word_ids(i) for i in range(len(rows))]
        aligned = [align_token_labels(word_ids[i], tags[i], tc.label_all_tokens, b_to_i) for i in range(len(rows))]
        return {
            "id": [r["id"] for r in rows],
            "input_ids": enc["input_ids"],
            "labels": aligned,
            "word_ids": [[-1 if w is None else w for w in ids] for ids in word_ids],
        }  # to score per word, not per piece

    def make_head(self, hidden: int, spec: TaskSpec, dropout: float) -> Any:
        from pipeline.modelling.heads import TokenHead

        return TokenHead(hidden, spec.num_labels, dropout)

    def loss(self, logits: Any, batch: dict[str, Any], weight: Any) -> Any:
        from torch import nn

        return nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            batch["labels"].reshape(-1),
            weight=weight,
            ignore_index=IGNORE_INDEX,
        )

    def distill_loss(self, student: Any, teacher: Any, batch: dict[str, Any], temperature: float) -> Any:
        """Per-token soft targets at every real (non-padding) token: the teacher's view of sub-tokens is signal too."""
        return soft_cross_entropy(student, teacher, temperature, dim=-1, mask=batch["attention_mask"].bool())

    def decode(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list:
        """One tag per word of each sentence, from the word's first sub-token (:func:`word_tags`, the task's
        ``decoding``); words cut by truncation get ``O``."""
        decoding = spec.settings.decoding
        return [
            word_tags(f["word_ids"], lg, len(row["tokens"]), spec.labels, decoding)[0]
            for f, lg, row in zip(features, logits, rows, strict=True)
        ]

    def gold(self, rows: Sequence[Row], spec: TaskSpec) -> list:
        return [list(r["tags"]) for r in rows]

    def trivial(self, train: Sequence[Row], rows: Sequence[Row], spec: TaskSpec) -> list:
        return [["O"] * len(r["tokens"]) for r in rows]

    def score(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> dict[str, Any]:
        return entity_metrics(gold, pred)

    def stats(self, gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec) -> np.ndarray:
        return entity_stats(gold, pred)

    def from_stats(self, summed: np.ndarray, spec: TaskSpec) -> dict[str, float]:
        return entity_from_stats(summed)

    def confidences(
        self, features: Sequence[Any], logits: Sequence[np.ndarray], rows: Sequence[Row], spec: TaskSpec
    ) -> list[Any]:
        """Per sentence, each word's probability of its decoded tag (from its first sub-token; 1.0 for a word
        truncation cut, whose ``O`` is no guess of the model's)."""
        decoding = spec.settings.decoding
        return [
            word_tags(f["word_ids"], lg, len(row["tokens"]), spec.labels, decoding)[1]
            for f, lg, row in zip(features, logits, rows, strict=True)
        ]

    def shown_answer(self, row: Row, answer: Any, spec: TaskSpec) -> str:
        return entities_text(row["tokens"], sorted(entity_spans(answer))) or "(no entity)"

    def mistake(self, row: Row, gold: Any, pred: Any, confidence: Any, spec: TaskSpec) -> Mistake | None:
        """The entities missed, spurious or typed wrong (strict IOB2 spans); confidence: the mean probability of
        the predicted tags over the words of those entities."""
        gs, ps = entity_spans(gold), entity_spans(pred)
        if gs == ps:
            return None
        missed, spurious = sorted(gs - ps), sorted(ps - gs)
        pred_at = {(s, e): t for s, e, t in spurious}
        pairs = [(t, pred_at.get((s, e), "O")) for s, e, t in missed]  # same span, other type, or no entity there
        gold_at = {(s, e) for s, e, _ in missed}
        pairs += [("O", t) for s, e, t in spurious if (s, e) not in gold_at]
        words = {w for s, e, _ in missed + spurious for w in range(s, e)}
        conf = float(np.mean([confidence[w] for w in sorted(words)])) if confidence is not None else None
        tokens = row["tokens"]
        return Mistake(
            entities_text(tokens, missed) or "(no entity)",
            entities_text(tokens, spurious) or "(no entity)",
            conf,
            conf if conf is not None else 0.0,
            tuple(pairs),
        )

    def seen_unseen(
        self, train: Sequence[Row], rows: Sequence[Row], gold: Sequence[Any], pred: Sequence[Any], spec: TaskSpec
    ) -> dict[str, dict[str, float]]:
        """Entity precision, recall and F1 over the mentions whose words (lower-cased) are, or are not, a gold
        mention in the train split (Augenstein et al. 2017: unseen mentions are where NER generalises or not)."""
        known = {mention(r["tokens"], s, e) for r in train for s, e, _ in entity_spans(r["tags"])}
        counts = {k: Counter[str]() for k in ("seen", "unseen")}
        for row, g, p in zip(rows, gold, pred, strict=True):
            gs, ps = entity_spans(g), entity_spans(p)
            for span in gs | ps:
                c = counts["seen" if mention(row["tokens"], span[0], span[1]) in known else "unseen"]
                c["gold"] += span in gs
                c["predicted"] += span in ps
                c["correct"] += span in gs and span in ps
        return {k: prf(c) for k, c in counts.items()}

    def request_row(self, row: Row) -> dict[str, Any]:
        return {"text": " ".join(row["tokens"])}

    def output_schema(self) -> list[Any]:
        from mlflow.types.schema import Array, ColSpec, Object, Property

        entity = Object(
            [
                Property("type", "string"),
                Property("text", "string"),
                Property("start", "long"),
                Property("end", "long"),
                Property("score", "double"),
            ]
        )
        return [ColSpec(Array(entity), "entities", required=False)]

    def serve(self, predictor: Any, spec: TaskSpec, recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Words from :func:`split_words` (with character offsets), a tag per word from its first
        sub-token (:func:`word_tags`, as evaluate decodes), entities from the BIO tags (``seqeval.get_entities``)."""
        from seqeval.metrics.sequence_labeling import get_entities

        words = [split_words(r["text"]) for r in recs]
        enc = predictor.tok(
            [[w for w, _ in ws] for ws in words],
            is_split_into_words=True,
            truncation=True,
            max_length=predictor.max_seq_length,
        )
        word_ids = [[-1 if w is None else w for w in enc.word_ids(i)] for i in range(len(recs))]
        out = []
        logits = predictor.logits(spec.name, {"input_ids": enc["input_ids"]})
        for rec, ws, wid, lg in zip(recs, words, word_ids, logits, strict=True):
            tags, conf = word_tags(wid, lg, len(ws), spec.labels, spec.settings.decoding)
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
