"""Pretraining inputs: documents -> word ids (BERT pre-tokenizer or jieba) -> packed ``[CLS] ... [SEP]`` blocks or
sentence pairs, written as Arrow IPC streams (memory-mapped by ``datasets``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from pipeline.core.console import Progress
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import file_digest
from pipeline.modelling.shards import ShardJob, ShardRecord
from pipeline.text.corpus_shards import iter_shard_batches
from pipeline.text.vocab import raw_backend

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.tokenize import TokenizeConfig


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
    progress = Progress(
        f"tokenize: {out.parent.name}/{out.name}", None, "documents"
    )  # a line every 10 s on a large corpus
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
            progress.update(docs, tokens=doc_tokens, blocks=writer.blocks)
    finally:
        writer.close()
        progress.close()
    return {
        "documents": docs,
        "characters": chars,
        "tokens": doc_tokens,
        "blocks": writer.blocks,
        "unk_tokens": unk_count,
    }


def write_shard(
    tok: Any, corpus_dir: Path, job: ShardJob, out_root: Path, tc: TokenizeConfig, seed: int
) -> tuple[ShardRecord, dict[str, Any]]:
    """Write one shard (``job``: packed blocks or sentence pairs of a run of corpus row groups) under ``out_root``;
    its manifest line and its counts. The same job gives the same bytes in any process (a Ray task or this one)."""
    out = out_root / job.file
    out.parent.mkdir(parents=True, exist_ok=True)
    batches = (
        iter_shard_batches(corpus_dir / job.corpus_file, tc.batch_docs, job.row_groups)
        if job.corpus_file is not None
        else iter([])
    )
    if job.kind == "pairs":
        counts: dict[str, Any] = write_sentence_pairs(tok, batches, out, tc, [seed, job.index])
        rows = counts["pairs"]
    else:
        segmenter = WordSegmenter(tc.language, tc.jieba_user_dict) if tc.whole_word else None
        counts = pack_texts(tok, batches, out, tc, segmenter)
        rows = counts["blocks"]
    return ShardRecord(job.group, job.file, rows, counts["tokens"], file_digest(out)), counts


_SENTENCE_END = {"en": re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])"), "zh": re.compile(r"(?<=[。！？!?])")}


def write_sentence_pairs(
    tok: Any, batches: Iterable[list[str]], out: Path, tc: TokenizeConfig, seed: int | list[int]
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
    pairs = tokens = 0
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for texts in batches:
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
                tokens += sum(len(a) + len(b) for a, b in zip(a_col, b_col, strict=True))
    return {"pairs": pairs, "tokens": tokens}


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
