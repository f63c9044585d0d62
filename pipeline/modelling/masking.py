"""Dynamic masking for masked-LM pretraining: token, whole-word, span and MacBERT n-gram masking.

Built on ``transformers.DataCollatorForLanguageModeling``: token masking is its own
``torch_mask_tokens`` unchanged. It falls short for the other two modes, hence the subclass:
its whole-word masking is offset-based (it cannot use the word ids the tokenize stage stored,
treats a run of Chinese characters as one word, and forces ``mask_replace_prob`` to 1) and it
has no span, n-gram or similar-word masking. Here words come from the ``word_ids`` column, the
selection is made per word (or per SpanBERT span, or MacBERT n-gram, of words), and the same
80/10/10 replacement is then applied per token; with a similar-word table
(:mod:`pipeline.modelling.similar_words`) the 80% get a similar token instead of ``[MASK]``
(MacBERT). Special tokens are never selected. Masks are drawn at batch time, never stored.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling

from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.modelling.similar_words import replace_with_similar


def pad_batch(examples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids``/``special_tokens_mask``/``word_ids`` to the longest row."""
    n = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    special = torch.ones((len(examples), n), dtype=torch.long)  # padding counts as special: never masked
    attention = torch.zeros((len(examples), n), dtype=torch.long)
    words = torch.full((len(examples), n), -1, dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e["input_ids"])
        ids[i, :k] = torch.as_tensor(e["input_ids"])
        special[i, :k] = torch.as_tensor(e["special_tokens_mask"])
        attention[i, :k] = 1
        if "word_ids" in e:
            words[i, :k] = torch.as_tensor(e["word_ids"])
    return {"input_ids": ids, "special_tokens_mask": special, "attention_mask": attention, "word_ids": words}


def pad_masked(examples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad already masked examples (``input_ids``, ``labels``)."""
    n = max(len(e["input_ids"]) for e in examples)
    out = {
        "input_ids": torch.full((len(examples), n), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(examples), n), dtype=torch.long),
        "labels": torch.full((len(examples), n), IGNORE_INDEX, dtype=torch.long),
    }
    for i, e in enumerate(examples):
        k = len(e["input_ids"])
        out["input_ids"][i, :k] = torch.as_tensor(e["input_ids"])
        out["attention_mask"][i, :k] = 1
        out["labels"][i, :k] = torch.as_tensor(e["labels"])
    return out


def select_whole_words(word_ids: np.ndarray, special: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """Token selection where every word is chosen with probability ``p`` and masked whole.

    Each token is then selected with probability ``p`` too (it is selected iff its word is),
    so the expected masking rate matches token masking.
    """
    selected = np.zeros(word_ids.shape, dtype=bool)
    for r in range(word_ids.shape[0]):
        w = np.where(special[r] == 1, -1, word_ids[r])
        n_words = int(w.max()) + 1 if (w >= 0).any() else 0
        if not n_words:
            continue
        chosen = rng.random(n_words) < p
        selected[r] = (w >= 0) & chosen[np.clip(w, 0, None)]
    return selected


def select_spans(
    word_ids: np.ndarray, special: np.ndarray, p: float, geo_p: float, max_words: int, rng: np.random.Generator
) -> np.ndarray:
    """SpanBERT selection: spans of whole words, lengths ~ Geometric(geo_p) clipped to ``max_words``,
    drawn until ``p`` of the row's maskable tokens are selected (see :func:`select_word_runs`)."""
    return select_word_runs(word_ids, special, p, lambda: min(int(rng.geometric(geo_p)), max_words), rng)


def select_ngrams(
    word_ids: np.ndarray, special: np.ndarray, p: float, ngram_probs: list[float], rng: np.random.Generator
) -> np.ndarray:
    """MacBERT's N-gram selection: runs of 1..len(ngram_probs) whole words, n drawn with ``ngram_probs``
    (40/30/20/10 for 1- to 4-grams in MacBERT), until ``p`` of the row's maskable tokens are selected."""
    sizes = np.arange(1, len(ngram_probs) + 1)
    return select_word_runs(word_ids, special, p, lambda: int(rng.choice(sizes, p=ngram_probs)), rng)


def select_word_runs(
    word_ids: np.ndarray, special: np.ndarray, p: float, draw_length: Any, rng: np.random.Generator
) -> np.ndarray:
    """Runs of consecutive whole words, lengths from ``draw_length()``, drawn until ``p`` of each row's
    maskable tokens are selected. Runs never overlap; the last one is cut to the budget, and a last word
    that does not fit is taken with the leftover probability, so the expected rate is ``p``."""
    selected = np.zeros(word_ids.shape, dtype=bool)
    for r in range(word_ids.shape[0]):
        w = np.where(special[r] == 1, -1, word_ids[r])
        maskable = int((w >= 0).sum())
        if not maskable:
            continue
        words = np.unique(w[w >= 0])
        budget = p * maskable  # tokens, fractional: the last word is taken with the leftover probability
        chosen = np.zeros(int(words.max()) + 1, dtype=bool)
        covered = 0
        for _ in range(10 * len(words)):  # bounded: every try masks at least one new word or skips
            if covered >= budget:
                break
            length = draw_length()
            start = int(rng.integers(0, len(words)))
            span = words[start : start + length]
            if chosen[span].any():
                continue  # runs do not overlap, as in SpanBERT
            sizes = np.array([int((w == x).sum()) for x in span])
            keep = int(np.searchsorted(np.cumsum(sizes), budget - covered, side="right"))
            if keep == 0:  # not even one word fits: take it with probability remaining/size (unbiased rate)
                if rng.random() < (budget - covered) / sizes[0]:
                    chosen[span[0]] = True
                break
            chosen[span[:keep]] = True  # the last run is cut to the budget
            covered += int(sizes[:keep].sum())
        selected[r] = (w >= 0) & chosen[np.clip(w, 0, None)]
    return selected


class MaskingCollator(DataCollatorForLanguageModeling):
    """Pads packed blocks and masks them: ``token``, ``whole_word`` or ``span``.

    A fixed ``seed`` gives the same masks on every pass (held-out evaluation). With
    ``batch_seed`` instead, each batch draws from a generator seeded by (``batch_seed``, ``epoch``,
    the batch's token ids): masks change every epoch yet depend on nothing else, so a run resumed
    from a checkpoint masks exactly as the uninterrupted one did. (The global RNG would not do:
    the data loader collates the next batch ahead of the current step, so the RNG state a
    checkpoint saves is already past that batch's masks.)
    """

    def __init__(  # noqa: PLR0913  # a collator takes its settings as keywords, as HF's collators do
        self,
        tokenizer: Any,
        masking: str = "token",
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        span_geometric_p: float = 0.2,
        span_max_words: int = 10,
        ngram_probs: list[float] | None = None,
        similar: torch.Tensor | None = None,
        seed: int | None = None,
        batch_seed: int | None = None,
    ) -> None:
        super().__init__(
            tokenizer=tokenizer,
            mlm=True,
            mlm_probability=mlm_probability,
            mask_replace_prob=mask_replace_prob,
            random_replace_prob=random_replace_prob,
            seed=seed,
            return_tensors="pt",
        )
        self.masking = masking
        self.batch_seed = batch_seed
        self.epoch = 0  # set by the trainer callback at each epoch start
        self.span_geometric_p = span_geometric_p
        self.span_max_words = span_max_words
        self.ngram_probs = ngram_probs or [0.4, 0.3, 0.2, 0.1]  # MacBERT's 1- to 4-gram shares
        self.similar = similar  # [vocab, k] similar-token table: replaces [MASK] (mask_token: similar)

    def seed_batch(self, content: bytes) -> None:
        """Seed this batch's generator from (``batch_seed``, ``epoch``, the batch's content)."""
        digest = hashlib.blake2b(content, digest_size=8, key=f"{self.batch_seed}:{self.epoch}".encode())
        self.generator = torch.Generator().manual_seed(int.from_bytes(digest.digest(), "big") >> 1)

    def _numpy_rng(self) -> np.random.Generator:
        # derived from the torch generator (or the global torch RNG) so one seed drives both
        return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=self.generator).item()))

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if self.seed is not None and self.generator is None:
            self.create_rng()
        if "labels" in examples[0]:  # already masked (the fixed evaluation set): only pad
            return pad_masked(examples, self.tokenizer.pad_token_id)
        if (
            os.environ.get("ADAPTBERT_SAMPLE_LOG") and self.batch_seed is not None
        ):  # tests: which blocks this process trained on
            with open(f"{os.environ['ADAPTBERT_SAMPLE_LOG']}.rank{os.environ.get('RANK', '0')}", "a") as f:
                f.writelines(hashlib.sha1(str(list(e["input_ids"])).encode()).hexdigest() + "\n" for e in examples)
        batch = pad_batch(examples, self.tokenizer.pad_token_id)
        if self.batch_seed is not None:
            self.seed_batch(batch["input_ids"].numpy().tobytes())
        special = batch.pop("special_tokens_mask")
        words = batch.pop("word_ids")
        if self.masking == "token" and self.similar is None:
            batch["input_ids"], batch["labels"] = self.torch_mask_tokens(
                batch["input_ids"], special_tokens_mask=special
            )
            return batch
        if self.masking == "token":  # the same Bernoulli selection as torch_mask_tokens, then similar words
            chance = torch.full(batch["input_ids"].shape, self.mlm_probability)
            chance.masked_fill_(special.bool(), 0.0)
            selected = torch.bernoulli(chance, generator=self.generator).bool()
            batch["input_ids"], batch["labels"] = self.replace(batch["input_ids"], selected)
            return batch
        if (words[special == 0] < 0).any():
            raise ValueError(f"masking: {self.masking} needs word ids: run tokenize with whole_word: true")
        rng = self._numpy_rng()
        if self.masking == "whole_word":
            selected = select_whole_words(words.numpy(), special.numpy(), self.mlm_probability, rng)
        elif self.masking == "ngram":
            selected = select_ngrams(words.numpy(), special.numpy(), self.mlm_probability, self.ngram_probs, rng)
        else:
            selected = select_spans(
                words.numpy(), special.numpy(), self.mlm_probability, self.span_geometric_p, self.span_max_words, rng
            )
        batch["input_ids"], batch["labels"] = self.replace(batch["input_ids"], torch.from_numpy(selected))
        return batch

    def replace(self, inputs: torch.Tensor, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The 80/10/10 step of ``torch_mask_tokens`` for a given selection (same probabilities); with a
        similar-word table the 80% get a similar token (a random one where none is close) instead of [MASK]."""
        labels = inputs.clone()
        labels[~selected] = IGNORE_INDEX
        to_mask = (
            torch.bernoulli(torch.full(labels.shape, self.mask_replace_prob), generator=self.generator).bool()
            & selected
        )
        if self.similar is None:
            inputs[to_mask] = self.tokenizer.mask_token_id
        else:
            replace_with_similar(inputs, to_mask, self.similar, len(self.tokenizer), self.generator)
        rest = 1 - self.mask_replace_prob
        if rest > 0 and self.random_replace_prob > 0:
            scaled = self.random_replace_prob / rest
            to_random = (
                torch.bernoulli(torch.full(labels.shape, scaled), generator=self.generator).bool() & selected & ~to_mask
            )
            random_ids = torch.randint(len(self.tokenizer), labels.shape, dtype=torch.long, generator=self.generator)
            inputs[to_random] = random_ids[to_random]
        return inputs, labels


class SentencePairCollator(MaskingCollator):
    """``[CLS] A [SEP] B [SEP]`` from the tokenize stage's sentence pairs, token-masked, with a
    sentence label decided at batch time: ``sop`` swaps A and B half of the time (label 1 =
    swapped, ALBERT), ``nsp`` replaces B by another pair's B half of the time (label 1 = not the
    next segment, BERT). Decisions use the same per-batch seeded generator as the masks."""

    def __init__(self, tokenizer: Any, objective: str, **kwargs: Any) -> None:
        super().__init__(tokenizer, masking="token", **kwargs)
        self.objective = objective

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if "labels" in examples[0]:
            return pad_masked(examples, self.tokenizer.pad_token_id)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        self.seed_batch(str([list(e["a_ids"]) for e in examples]).encode())
        flips = torch.bernoulli(torch.full((len(examples),), 0.5), generator=self.generator).long()
        if self.objective == "nsp" and len(examples) < 2:
            flips[:] = 0  # no other pair to borrow a B from
        shift = int(torch.randint(1, max(len(examples), 2), (1,), generator=self.generator))
        rows, types = [], []
        for i, e in enumerate(examples):
            a, b = list(e["a_ids"]), list(e["b_ids"])
            if flips[i] and self.objective == "sop":
                a, b = b, a
            elif flips[i]:
                b = list(examples[(i + shift) % len(examples)]["b_ids"])[: len(e["b_ids"])]  # keep the length budget
            rows.append(
                {
                    "input_ids": [cls, *a, sep, *b, sep],
                    "special_tokens_mask": [1] + [0] * len(a) + [1] + [0] * len(b) + [1],
                }
            )
            types.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
        batch = pad_batch(rows, self.tokenizer.pad_token_id)
        special = batch.pop("special_tokens_mask")
        batch.pop("word_ids")
        batch["input_ids"], batch["labels"] = self.torch_mask_tokens(batch["input_ids"], special_tokens_mask=special)
        token_type = torch.zeros_like(batch["input_ids"])
        for i, t in enumerate(types):
            token_type[i, : len(t)] = torch.as_tensor(t)
        batch["token_type_ids"] = token_type
        batch["next_sentence_label"] = flips
        return batch
