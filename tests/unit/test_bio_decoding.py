"""BIO-constrained (Viterbi) decoding of token tags: valid IOB2 always, the model's best valid reading."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tasks.token_classification import bio_is_valid, bio_viterbi, word_tags

LABELS = ["O", "B-Disease", "I-Disease", "B-Drug", "I-Drug"]


def log_probs(rows: list[list[float]]) -> np.ndarray:
    z = np.log(np.asarray(rows, dtype=np.float64))
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def brute_force(lp: np.ndarray, labels: list[str]) -> list[int]:
    """The valid tag sequence of highest summed log-probability, by enumeration."""
    best, best_score = None, -np.inf
    for seq in itertools.product(range(len(labels)), repeat=lp.shape[0]):
        if bio_is_valid([labels[i] for i in seq]):
            score = sum(lp[t, i] for t, i in enumerate(seq))
            if score > best_score:
                best, best_score = list(seq), score
    assert best is not None
    return best


def test_an_orphan_inside_tag_becomes_the_entity_the_model_meant() -> None:
    # word-wise argmax reads "O I-Disease I-Disease": strict IOB2 drops it; the chain reads B- I-
    tiny = 1e-6
    lp = log_probs([[0.9, 0.05, 0.05, tiny, tiny], [0.3, 0.25, 0.45, tiny, tiny], [0.2, 0.1, 0.7, tiny, tiny]])
    assert [LABELS[i] for i in lp.argmax(axis=1)] == ["O", "I-Disease", "I-Disease"]
    assert [LABELS[i] for i in bio_viterbi(lp, LABELS)] == ["O", "B-Disease", "I-Disease"]


def test_a_valid_argmax_reading_is_kept_as_it_is() -> None:
    lp = log_probs([[0.1, 0.8, 0.1, 0.0001, 0.0001], [0.1, 0.1, 0.8, 0.0001, 0.0001], [0.9, 0.05, 0.03, 0.01, 0.01]])
    assert bio_viterbi(lp, LABELS) == [int(i) for i in lp.argmax(axis=1)]
    assert bio_viterbi(np.zeros((0, 5)), LABELS) == []


def test_inside_tag_of_another_type_is_never_chosen() -> None:
    lp = log_probs([[0.01, 0.9, 0.03, 0.03, 0.03], [0.05, 0.05, 0.1, 0.1, 0.7]])  # B-Disease then I-Drug (invalid)
    tags = [LABELS[i] for i in bio_viterbi(lp, LABELS)]
    assert bio_is_valid(tags)
    assert tags != ["B-Disease", "I-Drug"]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_viterbi_equals_the_best_valid_sequence_by_enumeration(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lp = np.log(rng.dirichlet(np.ones(len(LABELS)) * 0.5, size=n) + 1e-12)
    path = bio_viterbi(lp, LABELS)
    assert bio_is_valid([LABELS[i] for i in path])
    best = brute_force(lp, LABELS)
    assert np.isclose(sum(lp[t, i] for t, i in enumerate(path)), sum(lp[t, i] for t, i in enumerate(best)))


def test_word_tags_read_first_sub_tokens_and_leave_cut_words_o() -> None:
    labels = ["O", "B-Disease", "I-Disease"]
    # [CLS] w0 w1 w1' w2 [SEP]; word 3 was cut by truncation
    word_ids = [-1, 0, 1, 1, 2, -1]
    logits = np.log(
        np.array([[1, 1, 1], [0.9, 0.05, 0.05], [0.3, 0.25, 0.45], [0.9, 0.05, 0.05], [0.2, 0.1, 0.7], [1, 1, 1]])
    )
    viterbi, conf = word_tags(word_ids, logits, 4, labels, "viterbi")
    assert viterbi == ["O", "B-Disease", "I-Disease", "O"]
    assert conf[3] == 1.0 and np.isclose(conf[1], 0.25) and np.isclose(conf[2], 0.7)
    argmax, _ = word_tags(word_ids, logits, 4, labels, "argmax")
    assert argmax == ["O", "I-Disease", "I-Disease", "O"]


def test_a_word_without_sub_tokens_inside_the_sentence_is_o_and_breaks_the_entity() -> None:
    labels = ["O", "B-Disease", "I-Disease"]
    word_ids = [-1, 0, 2, -1]  # word 1 produced no sub-token
    logits = np.log(np.array([[1, 1, 1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [1, 1, 1]]))
    tags, _ = word_tags(word_ids, logits, 3, labels, "viterbi")
    assert tags[1] == "O" and bio_is_valid(tags)
