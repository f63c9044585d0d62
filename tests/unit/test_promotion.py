"""The promotion gate is a pure function: tested in both directions, rule by rule."""

from __future__ import annotations

import pytest

from pipeline.core.reports.evaluation import ServedTask, VersionScores
from pipeline.tracking.gate import Candidate, Rules, choose_served, should_promote
from pipeline.tracking.promotion import all_metrics, primary_scores, version_tags_from_metrics
from tests.unit import typed_reports as c

RULES = Rules(min_delta=0.01, max_regression=0.02, min_gain_over_trivial=0.05, floors={})
CHAMPION = {"role.macro_f1": 0.80, "ner.f1": 0.70}


def test_a_better_challenger_is_promoted_and_a_worse_one_is_not() -> None:
    better = {"role.macro_f1": 0.84, "ner.f1": 0.71}
    worse = {"role.macro_f1": 0.78, "ner.f1": 0.69}
    up = should_promote(better, CHAMPION, RULES)
    down = should_promote(worse, CHAMPION, RULES)
    assert up.promote and up.reason.startswith("promoted")
    assert not down.promote and "does not beat it by min_delta" in down.reason
    # the comparison is not inverted: swapping the roles swaps the verdicts
    assert not should_promote(CHAMPION, better, RULES).promote
    assert should_promote(CHAMPION, worse, RULES).promote
    assert up.mean_challenger == pytest.approx(0.775) and up.mean_champion == pytest.approx(0.75)


def test_min_delta_is_a_margin_not_just_any_gain() -> None:
    tiny_gain = {"role.macro_f1": 0.805, "ner.f1": 0.70}  # mean +0.0025 < 0.01
    exact = {"role.macro_f1": 0.82, "ner.f1": 0.70}  # mean +0.01 == min_delta
    assert not should_promote(tiny_gain, CHAMPION, RULES).promote
    assert should_promote(exact, CHAMPION, RULES).promote
    assert not should_promote(
        dict(CHAMPION), CHAMPION, RULES
    ).promote  # a re-run of the same model never moves champion


def test_one_task_regressing_beyond_the_limit_blocks_a_better_mean() -> None:
    trade = {"role.macro_f1": 0.95, "ner.f1": 0.65}  # mean +0.05, but ner -0.05 > 0.02
    v = should_promote(trade, CHAMPION, RULES)
    assert not v.promote
    assert "ner.f1 regresses by 0.0500" in v.reason
    row = next(r for r in v.rows if r["metric"] == "ner.f1")
    assert row["delta"] == pytest.approx(-0.05) and not row["ok"]
    assert should_promote(trade, CHAMPION, Rules(0.01, 0.06, 0.05)).promote  # within a looser limit


def test_a_task_missing_from_the_challenger_or_with_a_changed_metric_fails() -> None:
    assert "has no ner.f1" in should_promote({"role.macro_f1": 0.99}, CHAMPION, RULES).reason
    renamed = {"role.accuracy": 0.99, "ner.f1": 0.90}  # role's primary metric changed: not comparable
    v = should_promote(renamed, CHAMPION, RULES)
    assert not v.promote and "has no role.macro_f1" in v.reason


def test_without_a_champion_every_task_must_clear_its_floor() -> None:
    trivial = {"role.macro_f1": 0.20, "ner.f1": 0.0}
    assert should_promote({"role.macro_f1": 0.30, "ner.f1": 0.40}, None, RULES, trivial).promote
    near_trivial = should_promote({"role.macro_f1": 0.22, "ner.f1": 0.40}, None, RULES, trivial)
    assert (
        not near_trivial.promote
        and "role.macro_f1 0.2200 is below 0.2500 (trivial 0.2000 + 0.05)" in near_trivial.reason
    )
    floors = Rules(0.01, 0.02, 0.05, {"ner": 0.6})
    low_ner = should_promote({"role.macro_f1": 0.90, "ner.f1": 0.50}, None, floors, trivial)
    assert not low_ner.promote and "ner.f1 0.5000 is below 0.6000 (floor 0.6)" in low_ner.reason
    assert should_promote({"role.macro_f1": 0.90, "ner.f1": 0.61}, None, floors, trivial).promote


def test_a_new_task_must_clear_its_floor_and_does_not_count_in_the_mean() -> None:
    challenger = {**CHAMPION, "role.macro_f1": 0.82, "qa.f1": 0.01}
    v = should_promote(challenger, CHAMPION, RULES, {"qa.f1": 0.05})
    assert not v.promote and "qa.f1 0.0100 is below 0.1000" in v.reason
    ok = should_promote({**challenger, "qa.f1": 0.30}, CHAMPION, RULES, {"qa.f1": 0.05})
    assert ok.promote and ok.mean_challenger == pytest.approx(0.76)  # over the champion's tasks only


def test_an_empty_or_unrelated_challenger_is_never_promoted() -> None:
    assert not should_promote({}, None, RULES).promote
    unrelated = should_promote({"other.f1": 0.99}, CHAMPION, RULES)
    assert not unrelated.promote and "shares no task metric" in unrelated.reason and unrelated.mean_challenger is None


def test_version_tags_round_trip_the_metrics_file() -> None:
    role = {"macro_f1": 0.7, "accuracy": 0.8, "per_class": {}}
    ner = {"f1": 0.3, "precision": 0.4, "per_type": {"X": {"f1": 0.3}}}
    metrics = VersionScores(
        {
            "role": ServedTask("macro_f1", role, {"macro_f1": 0.1}, None),
            "ner": ServedTask("f1", ner, {"f1": 0.0}, None),
        },
        0.5,
    )
    tags = version_tags_from_metrics(metrics)
    # what a person filters on: per task the primary metric and the trivial baseline's, and the mean; no more
    assert tags == {
        "primary.role.macro_f1": "0.7",
        "trivial.role.macro_f1": "0.1",
        "primary.ner.f1": "0.3",
        "trivial.ner.f1": "0.0",
        "mean_primary": "0.5",
    }
    scores, trivial = primary_scores(tags)
    assert scores == {"role.macro_f1": 0.7, "ner.f1": 0.3} and trivial == {"role.macro_f1": 0.1, "ner.f1": 0.0}
    every = {"role.macro_f1": 0.7, "role.accuracy": 0.8, "ner.f1": 0.3, "ner.precision": 0.4}
    assert metrics.metric_values() == every  # lineage.json's record of the version (numbers only, no per_type)
    assert all_metrics({**tags, "variant": "int8"}, {"test_metrics": {"int8": every}}) == every
    assert all_metrics(tags, None) == scores  # lineage.json unreadable: the primaries of the tags


def test_versions_registered_with_the_older_tags_still_read() -> None:
    """Before the trimmed set: ``primary.<task>`` named the metric, ``metric.<task>.<m>`` and ``trivial.<task>`` held
    the values. A champion registered then is still the gate's bar, and compare still lists its metrics."""
    old = {
        "primary.role": "macro_f1",
        "trivial.role": "0.1",
        "metric.role.macro_f1": "0.7",
        "metric.role.accuracy": "0.8",
        "primary.ner": "f1",
        "metric.ner.f1": "0.3",
    }
    assert primary_scores(old) == ({"role.macro_f1": 0.7, "ner.f1": 0.3}, {"role.macro_f1": 0.1})
    assert all_metrics(old, None) == {"role.macro_f1": 0.7, "role.accuracy": 0.8, "ner.f1": 0.3}


# ----------------------------------------------------------------------------- the serving rule

FULL = Candidate("full", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=10.0)


def _serve(*variants: Candidate, rule: str = "fastest_within") -> tuple[str, str, list]:
    return choose_served(FULL, list(variants), rule, max_mean_drop=0.01, max_task_drop=0.02)


def test_the_fastest_variant_within_the_rule_is_served_and_a_worse_one_is_not() -> None:
    close = Candidate("int8", 0.795, {"role": 0.845, "ner": 0.745}, p50_ms=5.0)  # -0.5 points, 2x faster
    far = Candidate("distilled", 0.77, {"role": 0.80, "ner": 0.74}, p50_ms=3.0)  # faster still, but -3 points
    choice, reason, rows = _serve(close, far)
    assert choice == "int8" and "fastest variant within the rule" in reason
    assert {r["model"]: r["ok"] for r in rows} == {"int8": True, "distilled": False}
    assert "mean drops 0.0300 > 0.01" in next(r["why"] for r in rows if r["model"] == "distilled")
    # the comparison is not inverted: a variant better than the full model qualifies, a worse one alone does not
    assert _serve(far)[0] == "full"
    assert _serve(Candidate("pruned", 0.81, {"role": 0.86, "ner": 0.76}, p50_ms=9.0))[0] == "pruned"


def test_one_task_dropping_too_far_disqualifies_a_variant_with_a_good_mean() -> None:
    lopsided = Candidate("int8", 0.80, {"role": 0.88, "ner": 0.72}, p50_ms=5.0)  # mean equal, ner -3 points
    choice, reason, rows = _serve(lopsided)
    assert choice == "full" and "the full model is served" in reason
    assert "ner drops 0.0300 > 0.02" in rows[0]["why"]
    exactly = Candidate("int8", 0.79, {"role": 0.84, "ner": 0.73}, p50_ms=5.0)  # -1 mean, -2 ner: on the limits
    assert _serve(exactly)[0] == "int8"


def test_a_variant_must_be_faster_and_rule_full_always_serves_the_full_model() -> None:
    slower = Candidate("pruned", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=11.0)
    assert _serve(slower)[0] == "full"
    unmeasured = Candidate("pruned", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=None)
    assert _serve(unmeasured)[0] == "full"
    fast = Candidate("int8", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=2.0)
    assert _serve(fast)[0] == "int8"
    choice, reason, _ = _serve(fast, rule="full")
    assert choice == "full" and "rule is full" in reason
    assert _serve()[0] == "full"  # no variants (compress disabled)


def test_a_variant_faster_only_within_the_timing_noise_is_not_served() -> None:
    """Was: the rule chose on the p50 alone, so a busy minute during the full model's timing made a variant "faster"."""
    full = Candidate("full", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=10.0, p50_range=(9.0, 12.0))
    overlapping = Candidate("int8", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=9.5, p50_range=(8.0, 9.5))
    choice, _, rows = choose_served(full, [overlapping], "fastest_within", 0.01, 0.02)
    assert choice == "full" and not rows[0]["ok"]
    assert (
        "faster only within the timing noise (rounds' p50 8.0-9.5 ms vs the full model's 9.0-12.0 ms)" in rows[0]["why"]
    )
    clear = Candidate("int8", 0.80, {"role": 0.85, "ner": 0.75}, p50_ms=6.0, p50_range=(5.5, 8.9))
    assert choose_served(full, [clear], "fastest_within", 0.01, 0.02)[0] == "int8"


def test_timings_on_a_loaded_machine_or_with_disagreeing_rounds_are_flagged() -> None:
    from pipeline.reporting.compression import noisy_timings
    from pipeline.reporting.timing import rounds_text, timing_noise

    steady = c.timing(10.0, p50_rounds_ms=[9.8, 10.0, 10.1, 10.3], load_1m=1.2, cores=2)
    assert timing_noise(steady) is None and rounds_text(steady) == "9.8-10.3"
    assert timing_noise(steady.model_copy(update={"load_1m": 3.5})) == "load average 3.5 on 2 cores"
    disagreeing = steady.model_copy(update={"p50_rounds_ms": [8.0, 10.0, 13.0]})
    assert timing_noise(disagreeing) == "rounds' p50 8.0-13.0 ms"
    assert timing_noise(c.timing(10.0)) is None and rounds_text(c.timing(10.0)) is None  # measured before rounds
    loaded = steady.model_copy(update={"load_1m": 4.0})
    report = c.report(c.full(speed=c.speed(bf16=steady)), int8=c.variant(speed=c.speed(fp32=loaded)))
    assert noisy_timings(report) == ["int8 (fp32): load average 4.0 on 2 cores"]


def test_a_version_description_says_what_it_is_how_good_and_what_it_costs() -> None:
    from pipeline.tracking.versions import version_description

    shown = VersionScores(
        {
            "role": ServedTask("macro_f1", {"macro_f1": 0.81234, "accuracy": 0.9}, {"macro_f1": 0.1}, None),
            "ner": ServedTask("f1", {"f1": 0.7}, {"f1": 0.0}, None),
        },
        0.75617,
    )
    entry = c.variant(0.75617, delta=-0.0123, size_mb=23.14, speed=c.speed(fp32=c.timing(5.26)))
    assert version_description("int8", shown, entry, "7") == (
        "int8 of version 7: mean primary 75.6 points (-1.2 vs full); role.macro_f1 81.2, ner.f1 70.0; 23.1 MB, "
        "batch-1 p50 5.3 ms (fp32)"
    )
    assert version_description("full", shown, None, None) == (
        "full model: mean primary 75.6 points; role.macro_f1 81.2, ner.f1 70.0"
    )
    untimed = version_description("full", shown, c.full(size_mb=90.0), None)  # timings not on disk: size only
    assert untimed == "full model: mean primary 75.6 points; role.macro_f1 81.2, ner.f1 70.0; 90.0 MB"
