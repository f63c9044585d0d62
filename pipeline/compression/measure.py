"""Measuring a compressed model's accuracy: test metrics against the full model, agreement, size.

Every task's test split is scored as evaluate scores it, with a paired bootstrap CI of (variant - full
model) on the primary metric over the same test examples. Its speed and memory, measured the way it
is served, are :mod:`pipeline.serving.speed`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.core.config import Config


def dir_megabytes(path: Path) -> float:
    """Size on disk of every file under ``path``, in MB (10^6 bytes)."""
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6, 2)


def score_against(  # noqa: PLR0913  # to become one job object (issue 29, part 4)
    model: Any,
    tasks: dict[str, Any],
    full: dict[str, Any],
    pad_id: int,
    batch_size: int,
    precision: Any,
    resamples: int,
    seed: int,
    confidence: float,
) -> dict[str, Any]:
    """Per task: the test metrics of ``model`` and the paired bootstrap CI of its primary metric minus ``full``'s.

    ``full`` maps a task to the full model's :class:`pipeline.training.multitask.Scored` test predictions.
    """
    from pipeline.tasks.metrics import bootstrap_interval, paired_bootstrap, primary_stats
    from pipeline.training.multitask import score_task

    out: dict[str, Any] = {}
    for name, data in tasks.items():
        spec = data.spec
        scored = score_task(model, data, "test", pad_id, batch_size, precision)
        stats, full_stats, metric = primary_stats(spec.kind, spec, scored.gold, scored.pred, full[name].pred)
        ci = paired_bootstrap(stats, full_stats, metric, resamples, seed, confidence)
        low, high = bootstrap_interval(stats, metric, resamples, seed, confidence)
        out[name] = {
            "primary": spec.primary,
            "value": scored.primary(spec),
            "value_ci": [low, high],  # the variant's own interval, from the same resamples as its change's
            "agreement": agreement(scored.pred, full[name].pred),
            "delta": ci["delta"],
            "ci_low": ci["low"],
            "ci_high": ci["high"],
            "metrics": {k: v for k, v in scored.metrics.items() if isinstance(v, float)},
        }
    return out


def agreement(pred: list[Any], reference: list[Any]) -> float | None:
    """Share of examples where ``pred`` equals ``reference`` exactly (label, tag sequence, answer, label set);
    ``None`` for real-valued predictions (regression), which never match exactly."""
    if not pred or any(isinstance(p, float) for p in pred):
        return None
    return sum(a == b for a, b in zip(pred, reference, strict=True)) / len(pred)


def floor_check(entry: dict[str, Any], full_mean: float, cfg: Config) -> tuple[bool, str]:
    """Whether a variant is servable under ``compress.accuracy_floor``, and why (pure)."""
    floor = cfg.compress.accuracy_floor
    drop = full_mean - entry["mean_primary"]
    worst = max(entry["tasks"].items(), key=lambda kv: -kv[1]["delta"])
    problems = []
    if drop > floor.max_mean_drop + 1e-12:
        problems.append(f"mean primary drops {drop:.4f} > max_mean_drop {floor.max_mean_drop}")
    if -worst[1]["delta"] > floor.max_task_drop + 1e-12:
        problems.append(f"{worst[0]} drops {-worst[1]['delta']:.4f} > max_task_drop {floor.max_task_drop}")
    return not problems, "; ".join(problems) or "within compress.accuracy_floor"


def fastest_full_ms(full_speed: dict[str, Any]) -> float:
    """The full model's batch-1 p50 in the precision that answers fastest (ms)."""
    return min(full_speed[p]["p50_ms"] for p in ("fp32", "bf16") if p in full_speed)


def against_full(
    name: str, entry: dict[str, Any], full: dict[str, Any], speeds: dict[str, Any], key: str, cfg: Config
) -> dict[str, Any]:
    """A variant's speed, size and floor verdict next to the full model's; ``key``: the precision it is served in."""
    verdict = floor_check(entry, full["mean_primary"], cfg)
    return {
        "speed": speeds[name],
        "served_in": key,
        "size_ratio": round(full["size_mb"] / entry["size_mb"], 2),
        # against the full model in the same precision (INT8, which has one, against the full model in each)
        "speedup_p50": {
            f"vs_full_{p}": round(speeds["full"][p]["p50_ms"] / speeds[name].get(p, speeds[name][key])["p50_ms"], 2)
            for p in ("fp32", "bf16")
            if p in speeds["full"]
        },
        # against the full model in whichever precision answers fastest (a bf16 full model can be slower than fp32)
        "speedup_vs_fastest_full": round(fastest_full_ms(speeds["full"]) / speeds[name][key]["p50_ms"], 2),
        "servable": verdict[0],
        "floor": verdict[1],
    }
