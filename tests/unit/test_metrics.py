"""Metrics on hand-made examples, and the bootstrap's sufficient statistics against the libraries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.tasks.metrics import (
    bootstrap_mean_delta,
    classification_from_stats,
    classification_metrics,
    classification_stats,
    entity_from_stats,
    entity_metrics,
    entity_stats,
    normalize_answer,
    paired_bootstrap,
    qa_from_stats,
    qa_metrics,
    qa_stats,
)


def test_seqeval_strict_entity_metrics_by_hand() -> None:
    gold = [["B-DRUG", "I-DRUG", "O", "B-DISEASE"], ["O", "B-DOSE", "I-DOSE"]]
    pred = [
        ["B-DRUG", "I-DRUG", "O", "O"],  # DRUG right, DISEASE missed
        ["O", "I-DOSE", "I-DOSE"],
    ]  # strict IOB2: an entity cannot start with I-, so no DOSE predicted
    m = entity_metrics(gold, pred)
    # 1 correct of 1 predicted, 3 gold
    assert m["precision"] == pytest.approx(1.0)
    assert m["recall"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx(2 * 1 * (1 / 3) / (1 + 1 / 3))
    assert m["per_type"]["DRUG"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert m["per_type"]["DISEASE"]["f1"] == 0.0 and m["per_type"]["DOSE"]["support"] == 1
    # a wrong boundary is a wrong entity (exact match of span and type)
    assert entity_metrics([["B-DRUG", "I-DRUG"]], [["B-DRUG", "O"]])["f1"] == 0.0


def test_squad_exact_match_and_f1_by_hand() -> None:
    assert normalize_answer("The  40 mg, twice daily.") == "40 mg twice daily"
    m = qa_metrics(
        [["40 mg twice daily"], ["kestrovir"], ["12 weeks", "twelve weeks"]],
        ["the 40 mg twice daily", "kestrovir sodium", "twelve weeks"],
    )
    # EM: 1, 0, 1 (best of the gold answers); F1: 1, 2*(1/2*1)/(1/2+1)=2/3, 1
    assert m["exact_match"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx((1 + 2 / 3 + 1) / 3)
    assert qa_metrics([["abc"]], [""])["f1"] == 0.0


def test_classification_metrics_by_hand() -> None:
    m = classification_metrics([0, 0, 1, 1, 2], [0, 1, 1, 1, 0])
    assert m["accuracy"] == pytest.approx(3 / 5) and m["micro_f1"] == pytest.approx(3 / 5)
    # F1 per class: 0: p=1/2 r=1/2 -> 1/2; 1: p=2/3 r=1 -> 4/5; 2: 0
    assert m["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)


def test_sufficient_statistics_agree_with_sklearn_and_seqeval() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        k = int(rng.integers(2, 6))
        gold, pred = rng.integers(0, k, 50).tolist(), rng.integers(0, k, 50).tolist()
        fast = classification_from_stats(classification_stats(gold, pred, k).sum(0), k)
        assert fast == pytest.approx(classification_metrics(gold, pred))
    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    gold = [[tags[i] for i in rng.integers(0, 5, 12)] for _ in range(40)]
    pred = [[tags[i] for i in rng.integers(0, 5, 12)] for _ in range(40)]
    slow = entity_metrics(gold, pred)
    fast = entity_from_stats(entity_stats(gold, pred).sum(0))
    assert fast == pytest.approx({k: slow[k] for k in ("precision", "recall", "f1")})
    answers, preds = [["a b c"], ["d e"], ["f"]], ["a b", "d e", "g"]
    assert qa_from_stats(qa_stats(answers, preds).sum(0)) == pytest.approx(qa_metrics(answers, preds))


def test_bootstrap_known_cases() -> None:
    n = 400
    right, wrong = np.ones((n, 3)), np.zeros((n, 3))
    right[:, 2] = wrong[:, 2] = 1  # QA stats rows: (em, f1, 1)
    em = lambda s: qa_from_stats(s)["exact_match"]  # noqa: E731
    same = paired_bootstrap(right, right, em, 500, seed=1)
    assert same["delta"] == 0 and same["low"] == 0 and same["high"] == 0
    sure = paired_bootstrap(right, wrong, em, 500, seed=1)
    assert sure["delta"] == 1 and sure["low"] == 1 and sure["high"] == 1
    # model a right on half the examples, b never: delta 0.5, CI ~ 0.5 +- 1.96 * sqrt(0.25 / n)
    half = wrong.copy()
    half[: n // 2, :2] = 1
    ci = paired_bootstrap(half, wrong, em, 2000, seed=1)
    width = 1.96 * np.sqrt(0.25 / n)
    assert ci["delta"] == pytest.approx(0.5)
    assert ci["low"] == pytest.approx(0.5 - width, abs=0.01) and ci["high"] == pytest.approx(0.5 + width, abs=0.01)
    # paired: the same resample for both models, so a constant shift has no spread at all
    assert paired_bootstrap(half, half, em, 200, seed=1)["high"] == 0


def test_the_mean_gain_over_tasks_has_the_normal_width_of_a_mean_of_independent_deltas() -> None:
    n = 400
    right, wrong = np.ones((n, 3)), np.zeros((n, 3))
    right[:, 2] = wrong[:, 2] = 1
    em = lambda s: qa_from_stats(s)["exact_match"]  # noqa: E731
    half = wrong.copy()
    half[: n // 2, :2] = 1
    # task 1: +0.5 with sd sqrt(0.25 / n); task 2: +1 without spread; the mean: +0.75 with half task 1's sd
    ci = bootstrap_mean_delta([(half, wrong, em), (right, wrong, em)], 2000, seed=1)
    width = 1.96 * np.sqrt(0.25 / n) / 2
    assert ci["delta"] == pytest.approx(0.75)
    assert ci["low"] == pytest.approx(0.75 - width, abs=0.006) and ci["high"] == pytest.approx(0.75 + width, abs=0.006)
    # two tasks alike: independent draws per task shrink the mean's spread by sqrt(2), not by nothing
    two = bootstrap_mean_delta([(half, wrong, em), (half, wrong, em)], 2000, seed=1)
    one = paired_bootstrap(half, wrong, em, 2000, seed=1)
    ratio = (one["high"] - one["low"]) / (two["high"] - two["low"])
    assert ratio == pytest.approx(np.sqrt(2), rel=0.1)
    assert np.isnan(bootstrap_mean_delta([(half, wrong, em)], 0, seed=1)["low"])


def test_a_models_own_interval_holds_its_value_narrows_with_examples_and_matches_the_paired_draws() -> None:
    from pipeline.tasks.metrics import bootstrap_interval, paired_bootstrap

    rng = np.random.default_rng(0)

    def accuracy(summed: np.ndarray) -> float:
        return float(summed[0] / summed[1])

    def stats(n: int) -> np.ndarray:  # per example: (right, 1), 70% right
        return np.stack([(rng.random(n) < 0.7).astype(float), np.ones(n)], axis=1)

    small, large = stats(100), stats(2500)
    lo_s, hi_s = bootstrap_interval(small, accuracy, 500, 13)
    lo_l, hi_l = bootstrap_interval(large, accuracy, 500, 13)
    assert lo_s < accuracy(small.sum(0)) < hi_s and lo_l < accuracy(large.sum(0)) < hi_l
    assert (hi_l - lo_l) < 0.35 * (hi_s - lo_s)  # 25x the examples: ~1/5 the width
    # against a model that is always wrong, the paired delta is the model's own accuracy: the same interval
    wrong = np.stack([np.zeros(100), np.ones(100)], axis=1)
    paired = paired_bootstrap(small, wrong, accuracy, 500, 13)
    assert (paired["low"], paired["high"]) == pytest.approx((lo_s, hi_s))
    assert all(math.isnan(x) for x in bootstrap_interval(small[:0], accuracy, 500, 13))
    assert all(math.isnan(x) for x in bootstrap_interval(small, accuracy, 0, 13))
