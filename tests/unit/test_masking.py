"""Masking: rates, 80/10/10, whole words together (English and Chinese), SpanBERT spans, specials never."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.modelling.masking import MaskingCollator, select_spans
from pipeline.modelling.models import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm", "tokenize.base_tokenizer")


def _blocks(tok, n_blocks: int, length: int, word_len: int = 3, seed: int = 0) -> list[dict]:
    """Synthetic packed blocks: [CLS] body [SEP], words of ``word_len`` tokens, a [SEP] inside."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_blocks):
        body = rng.integers(2000, 20000, length - 2).tolist()
        body[length // 2] = tok.sep_token_id  # a document separator inside the block
        ids = [tok.cls_token_id, *body, tok.sep_token_id]
        special = [1] + [int(t == tok.sep_token_id) for t in body] + [1]
        words, w = [], 0
        for i, s in enumerate(special):
            if s:
                words.append(-1)
            else:
                words.append(w)
                if (i % word_len) == word_len - 1:
                    w += 1
        rows.append({"input_ids": ids, "special_tokens_mask": special, "word_ids": words})
    return rows


@pytest.mark.parametrize("masking", ["token", "whole_word", "span"])
def test_rates_and_80_10_10_over_50k_tokens(tok, masking: str) -> None:
    rows = _blocks(tok, 500, 128)  # 63,000 maskable tokens
    collator = MaskingCollator(tok, masking=masking, seed=7)
    original = torch.tensor([r["input_ids"] for r in rows])
    batch = collator(rows)
    labels, inputs = batch["labels"], batch["input_ids"]
    special = torch.tensor([r["special_tokens_mask"] for r in rows]).bool()
    selected = labels != -100
    assert not (selected & special).any()  # special tokens are never masked
    assert torch.equal(labels[selected], original[selected])
    rate = selected.sum().item() / (~special).sum().item()
    assert abs(rate - 0.15) < 0.01, rate
    n = selected.sum().item()
    as_mask = (inputs[selected] == tok.mask_token_id).sum().item() / n
    kept = (inputs[selected] == original[selected]).sum().item() / n
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(1 - as_mask - kept - 0.1) < 0.02


def _check_whole_words(words: np.ndarray, selected: np.ndarray) -> None:
    for r in range(words.shape[0]):
        for w in np.unique(words[r][words[r] >= 0]):
            flags = selected[r][words[r] == w]
            assert flags.all() or not flags.any(), f"word {w} partly masked"


def test_whole_words_masked_together_english(tok) -> None:
    text = "Kestxevir cured pelvoid dermatosis in Tarsik-Okonkwo syndrome patients"
    from pipeline.modelling.blocks import WordSegmenter
    from pipeline.text.vocab import raw_backend

    enc = raw_backend(tok).encode(text, add_special_tokens=False)
    words = WordSegmenter("en", None).word_ids(text, enc)
    row = {
        "input_ids": [tok.cls_token_id, *enc.ids, tok.sep_token_id],
        "special_tokens_mask": [1] + [0] * len(enc.ids) + [1],
        "word_ids": [-1, *words.tolist(), -1],
    }
    collator = MaskingCollator(tok, masking="whole_word", mlm_probability=0.5, seed=3)
    batch = collator([row] * 64)
    selected = (batch["labels"] != -100).numpy()
    _check_whole_words(np.array([row["word_ids"]] * 64), selected)
    assert selected.any() and not selected.all()


@pytest.mark.parametrize("masking", ["whole_word", "ngram"])
def test_whole_words_masked_together_chinese(tok, masking: str) -> None:
    """jieba's words stay whole under whole-word masking and under MacBERT's n-grams of words."""
    import jieba

    from pipeline.modelling.blocks import WordSegmenter
    from pipeline.text.vocab import raw_backend

    text = "我爱北京天安门，北京欢迎你"
    enc = raw_backend(tok).encode(text, add_special_tokens=False)
    words = WordSegmenter("zh", None).word_ids(text, enc)
    assert len(set(words.tolist())) == len(list(jieba.tokenize(text)))
    row = {
        "input_ids": [tok.cls_token_id, *enc.ids, tok.sep_token_id],
        "special_tokens_mask": [1] + [0] * len(enc.ids) + [1],
        "word_ids": [-1, *words.tolist(), -1],
    }
    batch = MaskingCollator(tok, masking=masking, mlm_probability=0.5, seed=5)([row] * 64)
    selected = (batch["labels"] != -100).numpy()
    _check_whole_words(np.array([row["word_ids"]] * 64), selected)
    two_char = [w for w in set(words.tolist()) if (words == w).sum() >= 2]
    assert two_char  # 北京, 天安门, 欢迎: several characters, one id
    assert selected.any() and not selected.all()  # something was masked, and not everything
    word_row = np.array(words.tolist())
    masked_multi = {w for w in two_char for r in range(64) if selected[r][1:-1][word_row == w].all()}
    assert masked_multi  # a several-character word was masked, all of it


def test_spans_are_whole_words_within_bounds(tok) -> None:
    rows = _blocks(tok, 200, 128, word_len=2, seed=1)
    words = np.array([r["word_ids"] for r in rows])
    special = np.array([r["special_tokens_mask"] for r in rows])
    selected = select_spans(words, special, 0.15, 0.2, 4, np.random.default_rng(0))
    _check_whole_words(words, selected)
    assert not (selected & (special == 1)).any()
    lengths = []
    for r in range(words.shape[0]):
        chosen = sorted(set(words[r][selected[r]].tolist()))
        run = 1
        for a, b in itertools.pairwise(chosen):
            if b == a + 1:
                run += 1
            else:
                lengths.append(run)
                run = 1
        if chosen:
            lengths.append(run)
    # adjacent spans can touch, so a run may exceed one span; most runs are single spans of <= 4 words
    assert np.mean(np.array(lengths) <= 4) > 0.9
    rate = selected.sum() / (special == 0).sum()
    assert 0.14 < rate < 0.16


def test_fixed_seed_gives_identical_masks(tok) -> None:
    rows = _blocks(tok, 8, 64)
    a = MaskingCollator(tok, masking="span", seed=11)(rows)
    b = MaskingCollator(tok, masking="span", seed=11)(rows)
    assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["input_ids"], b["input_ids"])


@pytest.mark.parametrize("objective", ["sop", "nsp"])
def test_sentence_pair_batches(tok, objective: str) -> None:
    from pipeline.modelling.masking import SentencePairCollator

    rng = np.random.default_rng(0)
    pairs = [
        {"a_ids": rng.integers(2000, 9000, 10).tolist(), "b_ids": rng.integers(9000, 20000, 12).tolist()}
        for _ in range(400)
    ]
    batch = SentencePairCollator(tok, objective, batch_seed=1)(pairs)
    flips = batch["next_sentence_label"]
    assert 0.4 < flips.float().mean().item() < 0.6
    for i, p in enumerate(pairs):
        n = int(batch["attention_mask"][i].sum())
        ids = torch.where(batch["labels"][i] != -100, batch["labels"][i], batch["input_ids"][i])[
            :n
        ].tolist()  # undo the masks
        types = batch["token_type_ids"][i][:n].tolist()
        n_first = types.count(0) - 2
        first, second = ids[1 : 1 + n_first], ids[2 + n_first : -1]
        assert ids[0] == tok.cls_token_id and ids[1 + n_first] == tok.sep_token_id and ids[-1] == tok.sep_token_id
        assert types == [0] * (n_first + 2) + [1] * (len(second) + 1)
        if objective == "sop":
            assert (first, second) == ((p["b_ids"], p["a_ids"]) if flips[i] else (p["a_ids"], p["b_ids"]))
        else:
            assert first == p["a_ids"] and (second != p["b_ids"]) == bool(flips[i])


# ----------------------------------------------------------------------------- MacBERT: n-grams, similar words


def _runs(words: np.ndarray, selected: np.ndarray) -> list[int]:
    """Lengths (in words) of the maximal runs of consecutive selected words in each row."""
    lengths = []
    for r in range(words.shape[0]):
        chosen = sorted(set(words[r][selected[r]].tolist()))
        run = 0
        for i, w in enumerate(chosen):
            run = run + 1 if i and w == chosen[i - 1] + 1 else 1
            if i == len(chosen) - 1 or chosen[i + 1] != w + 1:
                lengths.append(run)
    return lengths


def test_ngrams_are_whole_words_at_the_rate_with_macbert_lengths(tok) -> None:
    rows = _blocks(tok, 600, 128, word_len=2, seed=2)
    words = np.array([r["word_ids"] for r in rows])
    special = np.array([r["special_tokens_mask"] for r in rows])
    from pipeline.modelling.masking import select_ngrams

    selected = select_ngrams(words, special, 0.15, [0.4, 0.3, 0.2, 0.1], np.random.default_rng(0))
    _check_whole_words(words, selected)
    assert not (selected & (special == 1)).any()
    rate = selected.sum() / (special == 0).sum()
    assert 0.145 < rate < 0.155, rate
    runs = np.array(_runs(words, selected))
    # runs of touching n-grams can merge, and the last one is cut to the budget; still, the mean run is
    # near MacBERT's expected n-gram length 1x.4 + 2x.3 + 3x.2 + 4x.1 = 2.0 words, and unigrams dominate less
    assert 1.8 < runs.mean() < 2.6, runs.mean()
    only_unigrams = select_ngrams(words, special, 0.15, [1.0], np.random.default_rng(0))
    assert np.array(_runs(words, only_unigrams)).mean() < 1.3  # isolated words (adjacent picks aside)


def test_ngram_collator_masks_at_the_rate_with_80_10_10(tok) -> None:
    rows = _blocks(tok, 500, 128)
    batch = MaskingCollator(tok, masking="ngram", seed=7)(rows)
    original = torch.tensor([r["input_ids"] for r in rows])
    special = torch.tensor([r["special_tokens_mask"] for r in rows]).bool()
    selected = batch["labels"] != -100
    assert abs(selected.sum().item() / (~special).sum().item() - 0.15) < 0.01
    _check_whole_words(np.array([r["word_ids"] for r in rows]), selected.numpy())
    as_mask = (batch["input_ids"][selected] == tok.mask_token_id).float().mean().item()
    kept = (batch["input_ids"][selected] == original[selected]).float().mean().item()
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.02


def _toy_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings where tokens 10..19 are near-copies of 20..29, 30.. are random, 5 is special."""
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(60, 16, generator=gen)
    emb[10:20] = emb[20:30] + 0.01 * torch.randn(10, 16, generator=gen)
    kinds = torch.zeros(60, dtype=torch.long)
    kinds[5] = -1
    kinds[40:50] = 1  # continuations
    return emb, kinds


def test_nearest_tokens_are_similar_of_the_same_kind_and_never_special() -> None:
    from pipeline.modelling.similar_words import nearest_tokens

    emb, kinds = _toy_table()
    emb[45] = emb[12] * 1.001  # a continuation right beside a word start: still not its neighbour
    table = nearest_tokens(emb, kinds, top_k=3, min_cosine=0.9)
    for i in range(10, 20):
        assert table[i, 0] == i + 10 and table[i + 10, 0] == i  # the near-copy comes first, both ways
    assert (table[5] == -1).all() and not (table == 5).any()  # a special token neither gets nor is a neighbour
    assert 45 not in table[12].tolist() and 12 not in table[45].tolist()
    assert (table[30:40] == -1).all()  # random directions in 16-d: nothing at cosine 0.9, so random fallback
    assert all(i not in table[i].tolist() for i in range(60))


def test_similar_replacement_uses_neighbours_or_falls_back_to_random(tok) -> None:
    from pipeline.modelling.similar_words import similar_word_table

    class Model(torch.nn.Module):
        def __init__(self, weights: torch.Tensor) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding.from_pretrained(weights)

        def get_input_embeddings(self) -> torch.nn.Embedding:
            return self.emb

    import safetensors.torch

    from pipeline.modelling.models import resolve_base

    weights = safetensors.torch.load_file(str(Path(resolve_base("minilm", "x")) / "model.safetensors"))
    emb = next(v for k, v in weights.items() if k.endswith("word_embeddings.weight"))
    with tempfile.TemporaryDirectory() as cache:
        table = similar_word_table(Model(emb), tok, 5, 0.5, Path(cache))
        again = similar_word_table(Model(emb), tok, 5, 0.5, Path(cache))  # from the cache file
        assert torch.equal(table, again) and len(list(Path(cache).iterdir())) == 1
    vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
    for i in tok.convert_tokens_to_ids(["drug", "patients", "##ing"]):
        neighbours = [vocab[j] for j in table[i].tolist() if j >= 0]
        assert neighbours and all(n.startswith("##") == vocab[i].startswith("##") for n in neighbours), neighbours
    rows = _blocks(tok, 400, 128)
    original = torch.tensor([r["input_ids"] for r in rows])
    batch = MaskingCollator(tok, masking="whole_word", similar=table, seed=9)(rows)
    selected = batch["labels"] != -100
    assert abs(selected.sum().item() / selected.numel() - 0.15) < 0.02
    got, was = batch["input_ids"][selected], original[selected]
    assert not (got == tok.mask_token_id).any()  # similar words replace [MASK] entirely
    changed = got != was
    assert abs(changed.float().mean().item() - 0.9) < 0.02  # 80% similar + 10% random; 10% kept
    has = (table[was] >= 0).any(dim=1)
    similar = (table[was] == got[:, None]).any(dim=1)
    # with a neighbour: about 8 in 9 changed tokens are one of them (the rest are the 10% random ones)
    share = similar[changed & has].float().mean().item()
    assert 0.85 < share < 0.92, share
    assert (changed & ~has).any()  # tokens without a neighbour were replaced too: by random tokens
