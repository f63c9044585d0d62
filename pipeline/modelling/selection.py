"""Corpus selection for the tasks (``pretrain.selection: nearest``): kNN-TAPT of Gururangan et al. 2020.

Every pretraining block of the corpus and every train input of every task is embedded with a
sentence-embedding model (all-MiniLM-L6-v2 by default: the model we ship is one) as
sentence-transformers does: the last hidden states mean-pooled over the real tokens, then L2
normalised, so a dot product is the cosine. Each train example keeps its ``k`` nearest blocks; the
union is the DAPT corpus.

The corpus is streamed in shards of ``SHARD_BLOCKS`` blocks: a shard is embedded (or read from the
cache), compared with every query, and only the running top-k per query is kept, so memory is
bounded by the queries, never by the corpus. Embeddings are cached per shard under a key that hashes
the shard's token ids, the tokenizer that made them and the embedder (its weights and the precision),
so a re-run with the same corpus embeds nothing. sentence-transformers would embed, but it is not a
dependency, has no cache and no streaming top-k: hence this module (the model and pooling are the same).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.io import file_digest

SHARD_BLOCKS = 1024  # corpus blocks per cache file and per comparison with the queries
QUERY_ROWS = 8192  # queries compared with one shard at once: 8192 x 1024 fp32 similarities = 32 MB
MAX_TOKENS = 256  # tokens per embedded text (all-MiniLM-L6-v2's max_seq_length in sentence-transformers)


class Embedder:
    """A sentence-embedding model: mean-pooled, L2-normalised last hidden states (sentence-transformers' pooling)."""

    def __init__(self, source: str, precision: Any, batch_size: int) -> None:
        from transformers import AutoModel, AutoTokenizer

        from pipeline.modelling.models import check_model_dir, check_weights

        check_model_dir(source, "pretrain.selection.embedder")
        check_weights(source, "pretrain.selection.embedder")
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = AutoModel.from_pretrained(source).eval()
        self.precision, self.batch_size = precision, batch_size
        weights = sorted(Path(source).glob("*.safetensors")) or sorted(Path(source).glob("*.bin"))
        digest = hashlib.sha256(f"{precision.name}:{MAX_TOKENS}:mean".encode())
        for w in weights:  # the weights define the embedding; a hub id without local files hashes its name
            digest.update(file_digest(w).encode())
        if not weights:
            digest.update(source.encode())
        self.fingerprint = digest.hexdigest()

    def embed_ids(self, rows: list[list[int]]) -> np.ndarray:
        """``[len(rows), hidden]`` float32 unit vectors of token-id sequences in the embedder's own vocabulary."""
        import torch

        pad = self.tokenizer.pad_token_id
        out = []
        order = np.argsort([len(r) for r in rows], kind="stable")  # similar lengths together: little padding
        for start in range(0, len(rows), self.batch_size):
            batch = [rows[i][:MAX_TOKENS] for i in order[start : start + self.batch_size]]
            width = max(len(r) for r in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, : len(r)] = torch.tensor(r)
                mask[i, : len(r)] = 1
            with torch.inference_mode(), self.precision.autocast():
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
            out.append(torch.nn.functional.normalize(pooled, dim=1).numpy())
        vectors = np.concatenate(out) if out else np.zeros((0, self.model.config.hidden_size), np.float32)
        result = np.empty_like(vectors)
        result[order] = vectors
        return result

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of plain texts (truncated at ``MAX_TOKENS`` tokens)."""
        ids = self.tokenizer(texts, truncation=True, max_length=MAX_TOKENS)["input_ids"] if texts else []
        return self.embed_ids(ids)


class EmbeddingCache:
    """Embeddings stored as ``<key>.npy`` files under ``folder``; :meth:`prune` removes those this run never used."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.used: set[str] = set()
        self.hits = self.misses = 0

    def get(self, key: str, compute: Any) -> np.ndarray:
        """The cached array under ``key``, or ``compute()``'s, written atomically for the next run."""
        path = self.folder / f"{key}.npy"
        self.used.add(path.name)
        if path.exists():
            try:
                self.hits += 1
                return np.load(path).astype(np.float16)
            except (OSError, ValueError):  # a damaged file is recomputed, never trusted
                self.hits -= 1
        self.misses += 1
        vectors = compute().astype(np.float16)  # fp16 halves the cache; cosines move by < 1e-3
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, vectors)
        tmp.replace(path)
        return vectors  # what a later run reads back, bit for bit: a cached run selects the same blocks

    def prune(self) -> int:
        """Delete the cache files this run did not use (an older corpus's); return how many."""
        stale = [p for p in self.folder.glob("*.npy") if p.name not in self.used]
        for p in stale:
            p.unlink()
        return len(stale)


@dataclass
class RunningTopK:
    """The ``k`` best blocks (by cosine) per query seen so far, as the corpus streams by."""

    queries: np.ndarray  # [n, hidden] unit vectors
    k: int
    scores: np.ndarray = field(init=False)
    index: np.ndarray = field(init=False)
    similarity_sum: float = field(init=False, default=0.0)  # sum of every query-block cosine (the mean pair)
    blocks: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.scores = np.full((len(self.queries), self.k), -np.inf, dtype=np.float32)
        self.index = np.full((len(self.queries), self.k), -1, dtype=np.int64)

    def update(self, vectors: np.ndarray, offset: int) -> None:
        """Merge one shard's blocks (rows ``offset..`` of the corpus) into every query's top-k."""
        import torch

        shard = torch.from_numpy(vectors.astype(np.float32))
        self.similarity_sum += float(self.queries.sum(0) @ shard.sum(0).numpy())
        self.blocks += len(vectors)
        take = min(self.k, len(vectors))
        for start in range(0, len(self.queries), QUERY_ROWS):
            rows = slice(start, start + QUERY_ROWS)
            sims = torch.from_numpy(self.queries[rows]) @ shard.T
            best, idx = sims.topk(take, dim=1)
            scores = np.concatenate([self.scores[rows], best.numpy()], axis=1)
            index = np.concatenate([self.index[rows], idx.numpy() + offset], axis=1)
            keep = np.argsort(-scores, axis=1, kind="stable")[:, : self.k]
            self.scores[rows] = np.take_along_axis(scores, keep, axis=1)
            self.index[rows] = np.take_along_axis(index, keep, axis=1)

    def mean_similarity(self) -> float:
        """The mean cosine of a query and a corpus block (what an unselected block looks like)."""
        return self.similarity_sum / max(len(self.queries) * self.blocks, 1)


def corpus_shards(blocks: Any) -> Iterator[tuple[int, list[list[int]]]]:
    """``(offset, token ids)`` of consecutive shards of a memory-mapped blocks dataset."""
    for start in range(0, len(blocks), SHARD_BLOCKS):
        yield start, blocks[start : start + SHARD_BLOCKS]["input_ids"]


def shard_key(ids: list[list[int]], tokenizer_digest: str, embedder: Embedder) -> str:
    """The cache key of one shard: its token ids, the tokenizer that made them and the embedder."""
    digest = hashlib.sha256(f"{embedder.fingerprint}:{tokenizer_digest}".encode())
    for row in ids:
        digest.update(np.asarray(row, dtype=np.int32).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:32]


def to_embedder_ids(ids: list[list[int]], tok: Any, embedder: Embedder, same_vocab: bool) -> list[list[int]]:
    """Blocks in the embedder's vocabulary: as they are when the vocabularies agree, else decoded and re-encoded."""
    if same_vocab:
        return ids
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    return embedder.tokenizer(texts, truncation=True, max_length=MAX_TOKENS)["input_ids"]


@dataclass
class Selection:
    """What :func:`select_nearest` chose: sorted block indices, and per query its nearest blocks and cosines."""

    blocks: np.ndarray  # sorted unique corpus block indices
    lengths: np.ndarray  # tokens of every corpus block
    neighbours: np.ndarray  # [queries, k] block index per query, best first
    scores: np.ndarray  # [queries, k] their cosines
    mean_similarity: float
    cache_hits: int
    cache_misses: int
    cache_pruned: int


def select_nearest(
    blocks: Any, queries: np.ndarray, k: int, tok: Any, tokenizer_digest: str, embedder: Embedder, cache: EmbeddingCache
) -> Selection:
    """The union of every query's ``k`` nearest corpus blocks, streaming the corpus shard by shard."""
    same_vocab = tok.get_vocab() == embedder.tokenizer.get_vocab()
    top = RunningTopK(queries, k)
    lengths: list[int] = []
    for offset, ids in corpus_shards(blocks):
        lengths += [len(r) for r in ids]
        vectors = cache.get(
            shard_key(ids, tokenizer_digest, embedder),
            lambda ids=ids: embedder.embed_ids(to_embedder_ids(ids, tok, embedder, same_vocab)),
        )
        top.update(vectors, offset)
    found = top.index[top.index >= 0]
    return Selection(
        blocks=np.unique(found),
        lengths=np.asarray(lengths, dtype=np.int64),
        neighbours=top.index,
        scores=top.scores,
        mean_similarity=top.mean_similarity(),
        cache_hits=cache.hits,
        cache_misses=cache.misses,
        cache_pruned=cache.prune(),
    )


def per_task_overlap(selection: Selection, query_tasks: np.ndarray) -> dict[str, Any]:
    """Per task: its queries, the blocks and tokens its neighbours hold, how many of those another task also chose,
    and the mean cosine of its nearest and its k-th nearest block."""
    owners: dict[int, set[str]] = {}
    for task, row in zip(query_tasks, selection.neighbours, strict=True):
        for b in row[row >= 0]:
            owners.setdefault(int(b), set()).add(str(task))
    out: dict[str, Any] = {}
    for task in sorted(set(query_tasks.tolist())):
        mine = [b for b, tasks in owners.items() if task in tasks]
        rows = query_tasks == task
        out[task] = {
            "train_inputs": int(rows.sum()),
            "blocks": len(mine),
            "tokens": int(selection.lengths[mine].sum()) if mine else 0,
            "shared_blocks": sum(1 for b in mine if len(owners[b]) > 1),
            "mean_top1_cosine": mean_finite(selection.scores[rows, 0]),
            "mean_kth_cosine": mean_finite(selection.scores[rows, -1]),  # -inf where the corpus has under k blocks
        }
    return out


def mean_finite(values: np.ndarray) -> float | None:
    """The mean of the finite values, rounded to 4 places (``None`` if there are none)."""
    finite = values[np.isfinite(values)]
    return round(float(finite.mean()), 4) if len(finite) else None
