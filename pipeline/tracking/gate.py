"""The promotion gate and the serving rule: pure functions of test metrics and latencies, no registry call.

The gate (:func:`should_promote`) decides whether a challenger may replace ``champion``; the serving rule
(:func:`choose_served`) which of a run's models (the full one or a compressed variant) is proposed as ``challenger``.
Both return their reason in one sentence and the rows behind it (``reports/promotion.json``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.sections.register import RegisterConfig

# ----------------------------------------------------------------------------- the gate (pure)


@dataclass(frozen=True)
class Rules:
    """Promotion rules, in metric units (fractions): see ``params.yaml: register``."""

    min_delta: float = 0.0
    max_regression: float = 0.0
    min_gain_over_trivial: float = 0.0
    floors: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_config(cls, rc: RegisterConfig) -> Rules:
        return cls(rc.min_delta, rc.max_regression, rc.min_gain_over_trivial, dict(rc.floors))


@dataclass(frozen=True)
class Verdict:
    """The gate's decision, its reason in one sentence, and the side-by-side rows behind it."""

    promote: bool
    reason: str
    rows: list[dict[str, Any]]
    mean_challenger: float | None
    mean_champion: float | None


def _floor(key: str, rules: Rules, trivial: Mapping[str, float]) -> tuple[float, str]:
    """The absolute minimum for ``key`` (``task.metric``) and how it came about."""
    task = key.split(".", 1)[0]
    need, why = -math.inf, "no floor"
    if key in trivial:
        need, why = (
            trivial[key] + rules.min_gain_over_trivial,
            f"trivial {trivial[key]:.4f} + {rules.min_gain_over_trivial}",
        )
    if task in rules.floors and rules.floors[task] > need:
        need, why = rules.floors[task], f"floor {rules.floors[task]}"
    return need, why


def should_promote(
    challenger: Mapping[str, float],
    champion: Mapping[str, float] | None,
    rules: Rules,
    trivial: Mapping[str, float] | None = None,
) -> Verdict:
    """Whether the challenger may replace the champion.

    Metrics are primary test metrics keyed ``task.metric`` (a task whose primary metric changed is a
    different key, hence not comparable). With a champion: every champion key must exist in the
    challenger; the mean over the champion's keys must rise by at least ``min_delta``; no key may
    drop by more than ``max_regression``; keys new in the challenger must clear their floor.
    Without a champion: every key must clear its floor (``trivial + min_gain_over_trivial`` and
    ``floors[task]``, whichever is higher).
    """
    trivial = trivial or {}
    if not challenger:
        return Verdict(False, "the challenger has no metrics", [], None, None)
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for key in sorted(set(challenger) | set(champion or {})):
        new, old = challenger.get(key), (champion or {}).get(key)
        row: dict[str, Any] = {
            "metric": key,
            "challenger": new,
            "champion": old,
            "delta": None,
            "check": "",
            "ok": True,
        }
        if new is None:
            row.update(check="missing in the challenger", ok=False)
            failures.append(f"the challenger has no {key}, which the champion has")
        elif old is None:
            need, why = _floor(key, rules, trivial)
            row.update(check=f">= {need:.4f} ({why})", ok=new >= need)
            if not row["ok"]:
                failures.append(f"{key} {new:.4f} is below {need:.4f} ({why})")
        else:
            row.update(
                delta=new - old,
                check=f"delta >= -{rules.max_regression}",
                ok=new - old >= -rules.max_regression - 1e-12,
            )
            if not row["ok"]:
                failures.append(f"{key} regresses by {old - new:.4f} (> max_regression {rules.max_regression})")
        rows.append(row)
    mean_new = sum(challenger.values()) / len(challenger)
    if champion is None:
        reason = (
            "promoted: no champion yet and every task clears its floor"
            if not failures
            else "not promoted: no champion yet, and " + "; ".join(failures)
        )
        return Verdict(not failures, reason, rows, mean_new, None)
    common = [k for k in champion if k in challenger]
    mean_old = sum(champion.values()) / len(champion) if champion else 0.0
    if not common:
        return Verdict(
            False,
            "not promoted: the challenger shares no task metric with the champion; " + "; ".join(failures),
            rows,
            None,
            mean_old,
        )
    mean_new_common = sum(challenger[k] for k in common) / len(common)
    delta = mean_new_common - mean_old
    if not delta >= rules.min_delta - 1e-12:
        failures.insert(
            0,
            f"mean primary {mean_new_common:.4f} vs champion {mean_old:.4f} (delta {delta:+.4f}) "
            f"does not beat it by min_delta {rules.min_delta}",
        )
    reason = (
        f"promoted: mean primary {mean_new_common:.4f} vs champion {mean_old:.4f} (delta {delta:+.4f} >= {rules.min_delta}), "
        f"no task regresses by more than {rules.max_regression}"
        if not failures
        else "not promoted: " + "; ".join(failures)
    )
    return Verdict(not failures, reason, rows, mean_new_common, mean_old)


# ----------------------------------------------------------------------------- the serving rule (pure)


@dataclass(frozen=True)
class Candidate:
    """One of a run's servable models: the full one or a compressed variant, as measured by compress."""

    name: str  # full | int8 | distilled | pruned | distilled_int8
    mean_primary: float
    primary: Mapping[str, float]  # task -> primary test metric
    p50_ms: float | None  # batch-1 p50 latency as served; None: not measured
    p50_range: tuple[float, float] | None = None  # lowest and highest p50 of its timed rounds (ms); None: no rounds


def choose_served(
    full: Candidate, variants: list[Candidate], rule: str, max_mean_drop: float, max_task_drop: float
) -> tuple[str, str, list[dict[str, Any]]]:
    """Which model of this run to propose for serving: ``(name, reason, rows)``.

    ``full``: the full model. ``fastest_within``: the variant with the lowest batch-1 latency whose mean
    primary metric is at most ``max_mean_drop`` below the full model's and no task more than
    ``max_task_drop`` below; it must also be faster than the full model beyond the timing noise (its slowest
    round's p50 below the full model's fastest, where rounds were timed). None qualifies: the full model.
    """
    rows = []
    eligible = []
    for v in variants:
        mean_drop = full.mean_primary - v.mean_primary
        worst = max(((t, full.primary[t] - v.primary.get(t, -math.inf)) for t in full.primary), key=lambda x: x[1])
        faster = v.p50_ms is not None and full.p50_ms is not None and v.p50_ms < full.p50_ms
        mine, theirs = v.p50_range, full.p50_range
        problems = []
        if mean_drop > max_mean_drop + 1e-12:
            problems.append(f"mean drops {mean_drop:.4f} > {max_mean_drop}")
        if worst[1] > max_task_drop + 1e-12:
            problems.append(f"{worst[0]} drops {worst[1]:.4f} > {max_task_drop}")
        if not faster:
            problems.append("not faster than the full model")
        elif mine and theirs and mine[1] >= theirs[0]:  # its slowest round is not below the full model's fastest
            problems.append(
                f"faster only within the timing noise (rounds' p50 {mine[0]:.1f}-{mine[1]:.1f} ms vs the full "
                f"model's {theirs[0]:.1f}-{theirs[1]:.1f} ms)"
            )
        rows.append(
            {
                "model": v.name,
                "p50_ms": v.p50_ms,
                "mean_primary": v.mean_primary,
                "ok": not problems,
                "why": "; ".join(problems),
            }
        )
        if not problems:
            eligible.append(v)
    if rule == "full":
        return full.name, "register.serve.rule is full: the full model is served", rows
    if not eligible:
        return full.name, "no variant is faster and within the serving rule: the full model is served", rows
    best = min(eligible, key=lambda v: (v.p50_ms, v.name))
    reason = (
        f"{best.name}: the fastest variant within the rule ({best.p50_ms:.2f} ms vs {full.p50_ms:.2f} ms batch-1 p50, "
        f"mean primary {best.mean_primary:.4f} vs {full.mean_primary:.4f})"
    )
    return best.name, reason, rows
