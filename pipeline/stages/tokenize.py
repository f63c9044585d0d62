"""tokenize stage: the tokenizer, packed pretraining blocks and tokenized task splits.

Vocabulary (``tokenize.mode``): the base model's WordPiece vocab, optionally extended with
mined domain words (``extend_vocab``), or a new WordPiece vocab trained on the corpus
(``wordpiece_scratch``). With ``whole_word: true`` every pretraining token also carries the id
of the word it belongs to: English words from the BERT pre-tokenizer, Chinese words from jieba
(transformers' offset-based whole-word masking would treat a run of Chinese characters as one
word). Corpus documents are encoded in batches by the Rust tokenizer, joined with ``[SEP]`` and
cut into ``[CLS] ... [SEP]`` blocks of ``max_seq_length`` tokens: no padding, every token kept.
Outputs are Arrow IPC stream files that ``datasets.Dataset.from_file`` memory-maps.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import regex

from pipeline.core.config import Config, ConfigError
from pipeline.core.errors import DataError
from pipeline.core.io import data_digest, read_report, require_inputs, transaction, write_json
from pipeline.core.paths import Paths
from pipeline.core.sections.tokenize import ExtendVocab, ScratchVocab, TokenizeConfig
from pipeline.modelling.models import load_tokenizer, max_positions
from pipeline.tasks.encoding import tokenize_tasks
from pipeline.tasks.registry import kind_of

# ----------------------------------------------------------------------------- reading


def iter_corpus_batches(
    corpus_dir: Path, split: str, batch_docs: int, max_docs: int | None = None
) -> Iterator[list[str]]:
    """Lists of at most ``batch_docs`` document texts, streamed from the ingest Parquet."""
    seen = 0
    for batch in pq.ParquetFile(corpus_dir / f"{split}.parquet").iter_batches(batch_size=batch_docs, columns=["text"]):
        texts = batch.column(0).to_pylist()
        if max_docs is not None:
            texts = texts[: max_docs - seen]
        seen += len(texts)
        if texts:
            yield texts
        if max_docs is not None and seen >= max_docs:
            return


def iter_task_text_batches(tasks_dir: Path, batch_docs: int) -> Iterator[list[str]]:
    """The labelled tasks' train inputs without their labels (one document per distinct input), in batches.

    Only train splits: task-adaptive pretraining must not read the texts it is evaluated on.
    """
    batch: list[str] = []
    for task_dir in sorted(p for p in tasks_dir.iterdir() if (p / "task.json").exists()):
        kind = kind_of(json.loads((task_dir / "task.json").read_text(encoding="utf-8"))["type"])
        rows = pq.read_table(task_dir / "train.parquet").to_pylist()
        for text in dict.fromkeys(" ".join(kind.input_texts(row)) for row in rows):  # an identical row once
            batch.append(text)
            if len(batch) == batch_docs:
                yield batch
                batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------- vocabulary


def raw_backend(tok: Any) -> Any:
    """A copy of the Rust tokenizer with padding and truncation off.

    Checkpoints often ship a ``tokenizer.json`` that pads and truncates to a fixed length
    (all-MiniLM-L6-v2 does, to 128): fine for sentence embeddings, wrong for packing a corpus.
    """
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend


# A BERT "word": a run of characters that are neither whitespace nor punctuation (Unicode P*
# or any ASCII non-alphanumeric), as in BertPreTokenizer. Needs `regex` for \p{P}.
_BERT_WORD = regex.compile(r"[^\s\p{P}\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e]+")


def count_words(tok: Any, batches: Iterable[list[str]]) -> Counter[str]:
    """Word frequencies as the tokenizer sees words (its normaliser + pre-tokenizer).

    Counting raw BERT-word runs first (C regex + C counter, one call per batch) and passing
    only the distinct runs through the Rust normaliser/pre-tokenizer gives the same count for
    every word as pre-tokenizing every document, about four times faster (the pre-tokenizer
    still splits what the normaliser changes, e.g. CJK characters become one word each).
    Punctuation marks are not counted: every use here keeps alphabetic words only.
    """
    raw: Counter[str] = Counter()
    for texts in batches:
        raw.update(_BERT_WORD.findall("\n".join(texts)))
    backend = raw_backend(tok)
    counts: Counter[str] = Counter()
    for run, freq in raw.items():
        for word in words_of(backend, run):
            counts[word] += freq
    return counts


def words_of(backend: Any, text: str) -> list[str]:
    """``text``'s words as the Rust tokenizer ``backend`` sees them (normaliser, then pre-tokenizer)."""
    norm = backend.normalizer
    return [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(norm.normalize_str(text) if norm else text)]


def pieces_per_word(tok: Any, words: list[str]) -> list[int]:
    """How many tokens each (already normalised, pre-tokenized) word becomes, batch-encoded."""
    if not words:
        return []
    encodings = raw_backend(tok).encode_batch([[w] for w in words], is_pretokenized=True, add_special_tokens=False)
    return [len(e.ids) for e in encodings]


def mine_new_tokens(base: Any, counts: Counter[str], ext: ExtendVocab) -> list[dict[str, Any]]:
    """Frequent alphabetic words split into >= ``min_pieces`` pieces, ranked by frequency x pieces saved."""
    candidates = [w for w, f in counts.items() if f >= ext.min_frequency and w.isalpha()]
    pieces = pieces_per_word(base, candidates)
    scored = [(counts[w] * (p - 1), w, p) for w, p in zip(candidates, pieces, strict=True) if p >= ext.min_pieces]
    scored.sort(key=lambda x: (-x[0], x[1]))
    return [
        {"token": w, "frequency": counts[w], "base_pieces": p, "score": s} for s, w, p in scored[: ext.max_new_tokens]
    ]


def extend_tokenizer(base: Any, words: list[str], out_dir: Path) -> tuple[Any, dict[str, Any]]:
    """Append ``words`` to the base WordPiece vocab (as word-initial pieces) and save to ``out_dir``.

    Appending to the WordPiece model's vocab, rather than ``add_tokens``, keeps true WordPiece
    behaviour: ``kestxevirs`` becomes ``kestxevir ##s``, and the new ids follow the base ones, so
    pretrain resizes the embeddings and initialises row ``id`` from ``piece_ids``.
    """
    from transformers import AutoTokenizer

    base.save_pretrained(out_dir)
    spec_path = out_dir / "tokenizer.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    if spec["model"]["type"] != "WordPiece":
        raise ConfigError(f"tokenize.extend_vocab needs a WordPiece base tokenizer, got {spec['model']['type']}")
    vocab: dict[str, int] = spec["model"]["vocab"]
    new_tokens: dict[str, Any] = {}
    backend = raw_backend(base)
    for word in words:
        if word in vocab:
            continue
        piece_ids = backend.encode([word], is_pretokenized=True, add_special_tokens=False).ids
        vocab[word] = len(vocab)
        new_tokens[word] = {"id": vocab[word], "pieces": base.convert_ids_to_tokens(piece_ids), "piece_ids": piece_ids}
    spec_path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    write_json(out_dir / "new_tokens.json", new_tokens)
    return AutoTokenizer.from_pretrained(out_dir), new_tokens


def train_scratch(batches: Iterable[list[str]], sc: ScratchVocab, max_seq_length: int, out_dir: Path) -> Any:
    """Train a BERT-style WordPiece vocab with ``tokenizers.trainers.WordPieceTrainer``.

    (``train_new_from_iterator`` on a BERT tokenizer would train BPE merges, not WordPiece.)
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoTokenizer, BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=sc.lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=sc.vocab_size,
        min_frequency=sc.min_frequency,
        special_tokens=list(sc.special_tokens),
        continuing_subword_prefix="##",
    )
    tok.train_from_iterator((t for texts in batches for t in texts), trainer=trainer)
    size = tok.get_vocab_size()
    if size > sc.vocab_size:  # the trainer always keeps the alphabet and the special tokens
        raise ConfigError(
            f"tokenize.scratch.vocab_size={sc.vocab_size} is smaller than the {len(sc.special_tokens)} special tokens "
            f"plus the {size - len(sc.special_tokens)} characters of the corpus alphabet; set it to more than {size}"
        )
    wrapped = BertTokenizer(tokenizer_object=tok, model_max_length=max_seq_length, do_lower_case=sc.lowercase)
    wrapped.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


# ----------------------------------------------------------------------------- words


class WordSegmenter:
    """Word ids per token of a batch: BERT pre-tokenizer words (en) or jieba words (zh)."""

    def __init__(self, language: str, user_dict: str | None) -> None:
        self.language = language
        self.jieba: Any = None
        if language == "zh":
            try:
                import jieba
            except ImportError:
                raise ConfigError(
                    "tokenize.language: zh needs the jieba package for word segmentation (pip install jieba)"
                ) from None
            jieba.setLogLevel(60)  # silence "Building prefix dict" chatter
            if user_dict:
                if not Path(user_dict).is_file():
                    raise DataError(user_dict, None, "missing-path", "tokenize.jieba_user_dict: file not found")
                jieba.load_userdict(user_dict)
            self.jieba = jieba

    def word_ids(self, text: str, encoding: Any) -> np.ndarray:
        """Per token, the index of its word in ``text`` (0-based, increasing)."""
        if self.jieba is None:
            return np.asarray(encoding.word_ids, dtype=np.int64)
        starts = np.fromiter((s for _, s, _ in self.jieba.tokenize(text)), dtype=np.int64)
        token_starts = np.fromiter((o[0] for o in encoding.offsets), dtype=np.int64, count=len(encoding.offsets))
        return np.searchsorted(starts, token_starts, side="right") - 1


# ----------------------------------------------------------------------------- packing


def _list_array(flat: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, value_type))


class BlockWriter:
    """Cuts a stream of token ids into ``[CLS] body [SEP]`` blocks and appends them to an Arrow file."""

    def __init__(self, path: Path, tok: Any, block: int, with_words: bool) -> None:
        self.body = block - 2
        self.cls, self.sep = tok.cls_token_id, tok.sep_token_id
        self.special = np.array(sorted(set(tok.all_special_ids)), dtype=np.int32)
        fields = [("input_ids", pa.list_(pa.int32())), ("special_tokens_mask", pa.list_(pa.int8()))]
        if with_words:
            fields.append(("word_ids", pa.list_(pa.int32())))
        self.schema = pa.schema(fields)
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, self.schema)
        self.ids = np.empty(0, dtype=np.int32)
        self.words = np.empty(0, dtype=np.int64) if with_words else None
        self.blocks = 0
        self.tokens = 0  # body tokens written (document tokens + separators)

    def add(self, ids: np.ndarray, words: np.ndarray | None) -> None:
        self.ids = np.concatenate([self.ids, ids])
        if self.words is not None and words is not None:
            self.words = np.concatenate([self.words, words])
        n = len(self.ids) // self.body
        if n:
            cut = n * self.body
            self._write(
                self.ids[:cut].reshape(n, self.body),
                None if self.words is None else self.words[:cut].reshape(n, self.body),
            )
            self.ids = self.ids[cut:]
            if self.words is not None:
                self.words = self.words[cut:]

    def _write(self, body: np.ndarray, words: np.ndarray | None) -> None:
        n = body.shape[0]
        ids = np.concatenate([np.full((n, 1), self.cls, np.int32), body, np.full((n, 1), self.sep, np.int32)], axis=1)
        lengths = np.full(n, ids.shape[1], dtype=np.int32)
        columns = [
            _list_array(ids.ravel(), lengths, pa.int32()),
            _list_array(np.isin(ids, self.special).astype(np.int8).ravel(), lengths, pa.int8()),
        ]
        if words is not None:
            # block-local word ids: 0 for the block's first word; -1 for special tokens
            first = np.where(words >= 0, words, np.iinfo(np.int64).max).min(axis=1, keepdims=True)
            local = np.where(words >= 0, words - first, -1)
            local = np.concatenate([np.full((n, 1), -1), local, np.full((n, 1), -1)], axis=1).astype(np.int32)
            columns.append(_list_array(local.ravel(), lengths, pa.int32()))
        self.writer.write_batch(pa.record_batch(columns, schema=self.schema))
        self.blocks += n
        self.tokens += body.size

    def close(self) -> None:
        if len(self.ids) and self.ids[-1] == self.sep:  # no separator after the last document
            self.ids = self.ids[:-1]
            if self.words is not None:
                self.words = self.words[:-1]
        if len(self.ids):
            self._write(self.ids[None, :], None if self.words is None else self.words[None, :])
        self.writer.close()
        self.sink.close()


def pack_texts(
    tok: Any, batches: Iterable[list[str]], out: Path, tc: TokenizeConfig, segmenter: WordSegmenter | None
) -> dict[str, Any]:
    """Encode batches of documents and write them as packed blocks (documents joined by [SEP]); return counts."""
    writer = BlockWriter(out, tok, tc.max_seq_length, segmenter is not None)
    backend = raw_backend(tok)
    unk = tok.unk_token_id
    docs = doc_tokens = unk_count = word_base = 0
    chars = 0
    try:
        for texts in batches:
            encodings = backend.encode_batch(texts, add_special_tokens=False)
            lengths = np.fromiter((len(e.ids) + 1 for e in encodings), dtype=np.int64, count=len(encodings))
            ids = np.empty(int(lengths.sum()), dtype=np.int32)
            words = np.empty(len(ids), dtype=np.int64) if segmenter else None
            pos = 0
            for text, enc, n in zip(texts, encodings, lengths, strict=True):
                ids[pos : pos + n - 1] = enc.ids
                ids[pos + n - 1] = writer.sep
                if words is not None and segmenter is not None:
                    w = segmenter.word_ids(text, enc)
                    words[pos : pos + n - 1] = w + word_base
                    words[pos + n - 1] = -1
                    word_base += int(w.max()) + 1 if len(w) else 0
                pos += n
            unk_count += int(np.count_nonzero(ids == unk))
            doc_tokens += len(ids) - len(texts)  # without the separators
            docs += len(texts)
            chars += sum(len(t) for t in texts)
            writer.add(ids, words)
    finally:
        writer.close()
    return {
        "documents": docs,
        "characters": chars,
        "tokens": doc_tokens,
        "blocks": writer.blocks,
        "unk_tokens": unk_count,
    }


_SENTENCE_END = {"en": re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])"), "zh": re.compile(r"(?<=[。！？!?])")}


def write_sentence_pairs(
    tok: Any, corpus_dir: Path, split: str, out: Path, tc: TokenizeConfig, seed: int
) -> dict[str, int]:
    """Segment A/B pairs of consecutive sentences of one document, for SOP/NSP objectives.

    As in BERT/ALBERT data creation: sentences accumulate until the segment budget
    (``max_seq_length - 3``) is reached, then the chunk is cut at a random sentence boundary
    into A and B. Swapping (SOP) or replacing B (NSP) happens at batch time, not here.
    """
    rng = np.random.default_rng(seed)
    backend = raw_backend(tok)
    budget = tc.max_seq_length - 3
    splitter = _SENTENCE_END[tc.language]
    schema = pa.schema([("a_ids", pa.list_(pa.int32())), ("b_ids", pa.list_(pa.int32()))])
    pairs = 0
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for texts in iter_corpus_batches(corpus_dir, split, tc.batch_docs):
            sentences = [[s for s in splitter.split(t) if s.strip()] for t in texts]
            flat = [s for doc in sentences for s in doc]
            encoded = iter(e.ids for e in backend.encode_batch(flat, add_special_tokens=False))
            a_col: list[list[int]] = []
            b_col: list[list[int]] = []
            for doc in sentences:
                chunk: list[list[int]] = []
                size = 0
                for _ in doc:
                    sent = next(encoded)
                    chunk.append(sent)
                    size += len(sent)
                    if size >= budget:
                        _emit_pair(chunk, budget, rng, a_col, b_col)
                        chunk, size = [], 0
                if len(chunk) >= 2:
                    _emit_pair(chunk, budget, rng, a_col, b_col)
            if a_col:
                writer.write_batch(
                    pa.record_batch(
                        [pa.array(a_col, pa.list_(pa.int32())), pa.array(b_col, pa.list_(pa.int32()))], schema=schema
                    )
                )
                pairs += len(a_col)
    return {"pairs": pairs}


def _emit_pair(chunk: list[list[int]], budget: int, rng: np.random.Generator, a_col: list, b_col: list) -> None:
    if len(chunk) < 2:
        return
    cut = int(rng.integers(1, len(chunk)))
    a = [t for s in chunk[:cut] for t in s]
    b = [t for s in chunk[cut:] for t in s]
    while len(a) + len(b) > budget:  # trim the longer segment, as BERT's truncate_seq_pair does
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    if a and b:
        a_col.append(a)
        b_col.append(b)


# ----------------------------------------------------------------------------- tasks


# ----------------------------------------------------------------------------- report


def fragmentation(base: Any, tok: Any, counts: Counter[str], terms: list[str]) -> dict[str, Any]:
    """Mean pieces per word (frequency-weighted, alphabetic words) and per domain-term word."""
    words = [w for w in counts if w.isalpha()]
    freq = np.array([counts[w] for w in words], dtype=np.float64)
    out: dict[str, Any] = {"distinct_words": len(words)}
    for label, t in (("base", base), ("final", tok)):
        pieces = np.array(pieces_per_word(t, words), dtype=np.float64)
        out[f"pieces_per_word_{label}"] = round(float((pieces * freq).sum() / freq.sum()), 4) if len(words) else None
    backend = raw_backend(tok)
    term_words = sorted({w for term in terms for w in words_of(backend, term) if w.isalpha()})
    out["domain_term_words"] = len(term_words)
    for label, t in (("base", base), ("final", tok)):
        out[f"pieces_per_domain_word_{label}"] = (
            round(float(np.mean(pieces_per_word(t, term_words))), 4) if term_words else None
        )
    return out


def read_terms(path: str | None, root: Path) -> list[str]:
    if not path:
        return []
    full = Path(path) if Path(path).is_absolute() else root / path
    if not full.is_file():
        raise DataError(
            path, None, "missing-path", "tokenize.domain_terms: file not found (set it to null to use the mined words)"
        )
    return [line.strip() for line in full.read_text(encoding="utf-8").splitlines() if line.strip()]


# ----------------------------------------------------------------------------- stage


def build_tokenizer(
    tc: TokenizeConfig, paths: Paths, base: Any, counts: Counter[str], out_dir: Path
) -> tuple[Any, list[dict[str, Any]]]:
    """The stage's tokenizer, saved in ``out_dir``: base, base + mined words, or trained from scratch."""
    if tc.mode == "wordpiece_scratch":
        return train_scratch(
            iter_corpus_batches(paths.corpus, "train", tc.batch_docs), tc.scratch, tc.max_seq_length, out_dir
        ), []
    if tc.extend_vocab.enabled:
        mined = mine_new_tokens(base, counts, tc.extend_vocab)
        tok, _ = extend_tokenizer(base, [m["token"] for m in mined], out_dir)
        return tok, mined
    base.save_pretrained(out_dir)
    return base, []


def check_positions(tc: TokenizeConfig) -> None:
    if tc.mode == "wordpiece_scratch":
        return  # the model is built later from params; pretrain checks its own limit
    limit = max_positions(tc.base_tokenizer, "tokenize.base_tokenizer")
    if limit is not None and tc.max_seq_length > limit:
        raise ConfigError(
            f"tokenize.max_seq_length={tc.max_seq_length} exceeds the position limit of the base model "
            f"'{tc.base_tokenizer}' (max_position_embeddings={limit})"
        )


def require_validated(paths: Paths) -> None:
    """The data must be exactly what the validate stage passed (``reports/validated.json``'s digest)."""
    require_inputs({paths.corpus: "ingest", paths.tasks: "ingest"})
    stamp = read_report(paths.validated_stamp, "validate")
    if stamp.get("data_sha256") != data_digest([paths.corpus, paths.tasks]):
        raise DataError(
            paths.validated_stamp,
            None,
            "not-validated",
            "data/corpus or data/tasks changed since they passed validation (or the last validation failed); "
            "run `dvc repro validate` (or `python -m pipeline validate`) first",
        )


def run(cfg: Config, paths: Paths, require_validation: bool = True) -> dict[str, Any]:
    """Build the tokenizer, pack the corpus, tokenize the tasks; write ``reports/tokenize.json``.

    ``require_validation=False`` is for callers that tokenize data they derived or generated
    themselves (benchmarks, the study's TAPT corpus); the stage itself always checks.
    """
    tc = cfg.tokenize
    if require_validation:
        require_validated(paths)
    check_positions(tc)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    base = load_tokenizer(tc.base_tokenizer, "tokenize.base_tokenizer")
    segmenter = WordSegmenter(tc.language, tc.jieba_user_dict) if tc.whole_word else None
    terms = read_terms(tc.domain_terms, paths.root)
    counts = count_words(base, iter_corpus_batches(paths.corpus, "train", tc.batch_docs, tc.mining_max_docs))
    timings["count_words_s"] = time.perf_counter() - start
    with transaction(paths.root, "tokenize") as txn:
        tok_dir, data_dir = txn.dir(paths.tokenizer), txn.dir(paths.tokenized)
        t0 = time.perf_counter()
        tok, mined = build_tokenizer(tc, paths, base, counts, tok_dir)
        timings["build_tokenizer_s"] = time.perf_counter() - t0
        (data_dir / "pretrain").mkdir()
        t0 = time.perf_counter()
        corpus = {
            split: pack_texts(
                tok,
                iter_corpus_batches(paths.corpus, split, tc.batch_docs),
                data_dir / "pretrain" / f"{split}.arrow",
                tc,
                segmenter,
            )
            for split in ("train", "validation")
        }
        timings["pack_s"] = time.perf_counter() - t0
        # the tasks' own train inputs, packed alike: pretraining adds them with pretrain.task_text (TAPT)
        task_text = pack_texts(
            tok,
            iter_task_text_batches(paths.tasks, tc.batch_docs),
            data_dir / "pretrain" / "task_text.arrow",
            tc,
            segmenter,
        )
        if tc.sentence_pairs:
            for split in ("train", "validation"):
                corpus[split].update(
                    write_sentence_pairs(
                        tok, paths.corpus, split, data_dir / "pretrain" / f"{split}_pairs.arrow", tc, cfg.seed
                    )
                )
        t0 = time.perf_counter()
        tasks = tokenize_tasks(tok, paths.tasks, data_dir / "tasks", tc)
        if mined:  # the un-adapted baseline is fine-tuned with the vocab it was trained with
            base.save_pretrained(data_dir / "baseline" / "tokenizer")
            tokenize_tasks(base, paths.tasks, data_dir / "baseline" / "tasks", tc)
        timings["tasks_s"] = time.perf_counter() - t0
        total_tokens = sum(c["tokens"] for c in corpus.values())
        report = {
            "mode": tc.mode,
            "whole_word": tc.whole_word,
            "language": tc.language,
            "vocab_size": len(tok),
            "base_vocab_size": len(base),
            "corpus": corpus,
            "task_text": task_text,
            "tokens": total_tokens,
            "blocks": sum(c["blocks"] for c in corpus.values()),
            "unk_share": round(sum(c["unk_tokens"] for c in corpus.values()) / max(total_tokens, 1), 6),
            "fragmentation": fragmentation(base, tok, counts, terms or [m["token"] for m in mined]),
            "new_tokens": len(mined),
            "top_new_tokens": [{k: m[k] for k in ("token", "frequency", "base_pieces")} for m in mined[:20]],
            "tasks": tasks,
            "seconds": {k: round(v, 2) for k, v in timings.items()},
            "pack_tokens_per_s": round(total_tokens / max(timings["pack_s"], 1e-9)),
            "pack_mb_per_s": round(
                sum(c["characters"] for c in corpus.values()) / 1e6 / max(timings["pack_s"], 1e-9), 2
            ),
        }
        txn.write_json(paths.tokenize_report, report)
    return report


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline tokenize`` (what ``run`` returned, read for a person)."""
    f = r["fragmentation"]
    return (
        f"{r['mode']} vocab of {r['vocab_size']} ({r['new_tokens']} new tokens){', word ids' if r['whole_word'] else ''}; "
        f"{r['tokens']} tokens -> {r['blocks']} blocks of <= {cfg.tokenize.max_seq_length}; [UNK] share {r['unk_share']:.4%}\n"
        f"pieces per word {f['pieces_per_word_base']} -> {f['pieces_per_word_final']}, "
        f"per domain-term word {f['pieces_per_domain_word_base']} -> {f['pieces_per_domain_word_final']}\n"
        f"{r['pack_tokens_per_s']} tokens/s; report: {paths.tokenize_report}"
    )
