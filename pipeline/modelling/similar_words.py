"""Similar-word replacement for MacBERT-style masking (``pretrain.mask_token: similar``).

MacBERT (Cui et al. 2020) replaces a word selected for prediction by a *similar* word instead of
``[MASK]``, a token fine-tuning never sees. MacBERT took its neighbours from a word2vec toolkit; here
they come from the vocabulary itself: the nearest tokens to each token by cosine similarity of the
base model's input embeddings, among tokens of the same kind (a word start stays a word start, a
``##`` continuation a continuation, so a replaced whole word keeps its boundaries). A token whose
nearest neighbour is below ``min_cosine`` has none, and is replaced by a random token instead.

The table is ``[vocab, top_k]`` token ids (``-1`` where fewer neighbours qualify), computed once
from the embeddings training starts from (the base model, after any vocabulary extension) and cached
in a file keyed by a hash of those embeddings: a resumed run finds the same table, and neighbours
never drift with the embeddings being trained. Nothing in ``transformers`` or ``tokenizers`` offers
this, hence the module.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

ROWS_PER_CHUNK = 2048  # embedding rows compared at once: 2048 x 30522 fp32 similarities = 250 MB


def candidate_kinds(tokens: list[str], special_ids: set[int]) -> torch.Tensor:
    """Per token id: 0 a word start, 1 a ``##`` continuation, -1 never a replacement (special, ``[unusedN]``)."""
    kinds = torch.zeros(len(tokens), dtype=torch.long)
    for i, t in enumerate(tokens):
        if i in special_ids or (t.startswith("[") and t.endswith("]")):
            kinds[i] = -1
        elif t.startswith("##"):
            kinds[i] = 1
    return kinds


def nearest_tokens(embeddings: torch.Tensor, kinds: torch.Tensor, top_k: int, min_cosine: float) -> torch.Tensor:
    """``[vocab, top_k]``: each token's nearest tokens of its own kind by cosine similarity, best first,
    ``-1`` where the similarity is below ``min_cosine`` (and for tokens of kind -1).

    Each kind is compared with itself only (word starts with word starts, continuations with continuations): no mask
    over the other kind's columns, and fewer columns; 2x faster than one masked vocab x vocab pass, the same table
    (MiniLM's 30,522 tokens: 9.7 -> 4.9 s on a 2-core EPYC)."""
    unit = torch.nn.functional.normalize(embeddings.detach().float(), dim=1)
    out = torch.full((unit.shape[0], top_k), -1, dtype=torch.long)
    for kind in kinds.unique().tolist():
        members = (kinds == kind).nonzero().squeeze(1)  # token ids of this kind, ascending
        k = min(top_k, len(members) - 1)  # never the token itself
        if kind < 0 or k <= 0:
            continue
        group = unit[members]
        for start in range(0, len(members), ROWS_PER_CHUNK):
            stop = min(start + ROWS_PER_CHUNK, len(members))
            sims = group[start:stop] @ group.T
            own = torch.arange(stop - start)
            sims[own, own + start] = -2.0
            best, ids = sims.topk(k, dim=1)
            ids = members[ids]
            ids[best < min_cosine] = -1
            out[members[start:stop], :k] = ids
    return out


def embeddings_key(embeddings: torch.Tensor, top_k: int, min_cosine: float) -> str:
    """A short hash of the embedding matrix and the table's settings: the cache file's name."""
    digest = hashlib.sha256(embeddings.detach().float().contiguous().numpy().tobytes())
    digest.update(f"{top_k}:{min_cosine}".encode())
    return digest.hexdigest()[:16]


def similar_word_table(model: Any, tokenizer: Any, top_k: int, min_cosine: float, cache_dir: Path) -> torch.Tensor:
    """The neighbour table of ``model``'s input embeddings, from ``cache_dir`` when it was computed before."""
    embeddings = model.get_input_embeddings().weight
    path = cache_dir / f"similar-words-{embeddings_key(embeddings, top_k, min_cosine)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    vocab = tokenizer.get_vocab()
    tokens = [""] * embeddings.shape[0]
    for token, i in vocab.items():
        if i < len(tokens):
            tokens[i] = token
    kinds = candidate_kinds(tokens, set(tokenizer.all_special_ids))
    table = nearest_tokens(embeddings, kinds, top_k, min_cosine)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(table, tmp)
    tmp.replace(path)  # atomic: a killed run never leaves half a table
    return table


def coverage(table: torch.Tensor) -> float:
    """Share of replaceable tokens that have at least one similar token (the rest fall back to random)."""
    has_row = (table >= 0).any(dim=1)
    return float(has_row.float().mean())


def replace_with_similar(
    inputs: torch.Tensor, where: torch.Tensor, table: torch.Tensor, vocab_size: int, generator: torch.Generator | None
) -> None:
    """In place: every token at ``where`` becomes one of its similar tokens, uniformly, or a random token
    when it has none (MacBERT's fallback)."""
    originals = inputs[where]
    if originals.numel() == 0:
        return
    choices = table[originals.clamp(max=table.shape[0] - 1)]  # [n, top_k]
    counts = (choices >= 0).sum(dim=1)
    pick = (torch.rand(originals.shape, generator=generator) * counts.clamp(min=1)).long()
    similar = choices.gather(1, pick[:, None]).squeeze(1)
    random_ids = torch.randint(vocab_size, originals.shape, dtype=torch.long, generator=generator)
    inputs[where] = torch.where(counts > 0, similar, random_ids)
