"""The adaptation chosen on the user's dev splits (``adapt.strategy: auto``): a successive-halving tournament.

Every arm is one way to spend the same minutes: ``dapt`` (masked-LM on the corpus), ``tapt`` (on the tasks' own
train inputs), ``dapt+tapt`` (both, mixed) each pretrain for a rung's minutes and then fine-tune its steps; ``none``,
the reference, fine-tunes the un-adapted base model for those steps plus as many more as the adaptation minutes
buy at the measured fine-tuning speed (``finetune.baseline_budget: same_compute``'s rule). Each rung keeps the
better ``adapt.keep`` share of the adaptation arms and multiplies both budgets by ``1 / keep``; an arm's longer
pretraining continues from its shorter one's model. ``none`` runs in every rung: the last rung compares the best
adaptation with fine-tuning alone at the largest equal budget, and the adaptation wins only if its dev mean is
higher. Every score is the mean primary metric of the tasks' dev splits (test is never read here).

Hyperband's successive halving (Li et al. 2018) is written out here rather than taken from Optuna: its pruners
stop trials step by step within one training, while an arm here is a chain of two trainings (pretraining, then
fine-tuning anew) whose budgets grow between rungs.

Work stays in ``checkpoints/adapt/<digest>/`` (kept between runs): a finished (arm, rung, seed) is a JSON file
there, so a killed tournament resumes from its finished arms and a changed configuration or data starts anew.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.config import Config
from pipeline.core.io import missing_input, read_report, write_json
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.sections.adapt import ARM_NAMES, AdaptConfig
from pipeline.modelling.precision import Precision
from pipeline.reporting.numbers import points, points_interval
from pipeline.tracking.runs import nested_run
from pipeline.training.adaptation import ARM_PRETRAIN, choice_digest, with_pretrain
from pipeline.training.pretraining.budget import NO_STEP_CAP


@dataclass(frozen=True)
class Arena:
    """Where a tournament plays: the configuration, the project's data, its work folder, the precision."""

    cfg: Config
    data: Paths
    work: Path  # checkpoints/adapt/<digest>
    precision: Precision

    def folder(self, arm: str, rung: int) -> Path:
        """``work/<arm>/rung-<k>``: an arm's pretraining root at a rung (its fine-tuning runs below it)."""
        return self.work / slug(arm) / f"rung-{rung}"


def slug(arm: str) -> str:
    """``dapt+tapt`` -> ``dapt-tapt``: an arm's name in folders, MLflow run names and console prefixes."""
    return arm.replace("+", "-")


def with_finetune_steps(cfg: Config, steps: int) -> Config:
    """``cfg`` fine-tuning for exactly ``steps`` steps (epochs off), evaluating on dev four times, no early stop."""
    from pipeline.core.sections.finetune import FinetuneConfig

    data = cfg.finetune.model_dump(mode="python")
    every = max(steps // 4, 1)
    data |= {
        "max_steps": steps,
        "epochs": None,
        "eval_steps": every,
        "logging_steps": min(data["logging_steps"], every),
        "early_stopping_patience": 100,  # every arm trains its whole budget and keeps its best dev checkpoint
        "baseline": False,
        "single_task": False,
    }
    for task in data["tasks"].values():
        task["epochs"] = None
    return cfg.model_copy(update={"finetune": FinetuneConfig.model_validate(data)})


# ----------------------------------------------------------------------------- one arm


def arm_root(arena: Arena, arm: str, rung: int) -> Paths:
    """An arm's project root at a rung, reading the project's tokenizer, blocks and selection through links."""
    paths = Paths(arena.folder(arm, rung))
    links = [(arena.data.tokenizer, paths.tokenizer), (arena.data.tokenized, paths.tokenized)]
    if arena.data.selection.is_dir():
        links.append((arena.data.selection, paths.selection))
    for src, dst in links:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            dst.symlink_to(src.resolve(), target_is_directory=True)
    return paths


def pretrain_arm(arena: Arena, arm: str, rung: int) -> tuple[Path, float]:
    """Pretrain ``arm`` to its cumulative minutes at ``rung``, continuing the previous rung's model; return the
    model folder and the arm's cumulative training seconds."""
    from pipeline.training.pretraining.run import run_pretraining

    ac = arena.cfg.adapt
    paths = arm_root(arena, arm, rung)
    before = 0.0
    start: dict[str, Any] = {}
    if rung > 0:
        previous = arm_root(arena, arm, rung - 1)
        before = trained_seconds(read_report(previous.pretrain_report, PretrainReport), previous.pretrain_report)
        start = {"base_model": str(previous.dapt.resolve()), "head_warmup_steps": 0}
    minutes = ac.rung_pretrain_minutes(rung) - (ac.rung_pretrain_minutes(rung - 1) if rung else 0.0)
    arm_cfg = with_pretrain(
        arena.cfg,
        # no held-out evaluation while it trains (arms are judged by fine-tuning on dev; the end's is measured)
        {
            **ARM_PRETRAIN[arm],
            **start,
            "budget_minutes": minutes,
            "max_steps": NO_STEP_CAP,
            "eval_steps": NO_STEP_CAP,
            "nproc": 1,
        },
    )
    if paths.pretrain_report.exists() and paths.dapt.exists():  # a killed tournament resumes here
        report = read_report(paths.pretrain_report, PretrainReport)
    else:
        with nested_run(f"adapt-{slug(arm)}-rung{rung}-pretrain"):  # its own MLflow run, as each fine-tuning has
            report = run_pretraining(arm_cfg, paths)
    return paths.dapt, before + trained_seconds(report, paths.pretrain_report)


def trained_seconds(report: PretrainReport, path: Path) -> float:
    """The seconds an arm's pretraining trained (its report's measured half, which a resumed tournament needs)."""
    if report.train_seconds is None:
        raise missing_input(path, "its measured half (the seconds it trained) is missing under measured/")
    return report.train_seconds


def finetune_arm(arena: Arena, arm: str, rung: int, seed: int, steps: int, encoder: Path | None) -> dict[str, Any]:
    """Fine-tune ``encoder`` (``None``: the un-adapted base) for ``steps`` with ``seed``; score every dev split."""
    from pipeline.training.contenders import Contender, TrainPlace, baseline_contender, train_contender
    from pipeline.training.data import load_tasks
    from pipeline.training.multitask import load_encoder, score_task

    cfg, data, precision = arena.cfg, arena.data, arena.precision
    run_cfg = with_finetune_steps(cfg, steps).model_copy(update={"seed": seed})
    if encoder is None:
        contender = baseline_contender(run_cfg, data)
    else:
        from transformers import AutoTokenizer

        contender = Contender(
            arm,
            load_encoder(encoder, f"the {arm} arm"),
            AutoTokenizer.from_pretrained(data.tokenizer),
            data.task_features,
            str(encoder),
        )
    contender.name = slug(arm)
    where = arena.folder(arm, rung) / f"seed-{seed}"
    place = TrainPlace(
        where / "checkpoints", where / "curves", f"adapt-{contender.name}-rung{rung}-seed{seed}", "adapt"
    )
    tasks = load_tasks(run_cfg, data, contender.tokenized)
    model, summary = train_contender(run_cfg, data, contender, tasks, precision, place=place)
    dev, stats = {}, {}
    for name, task in tasks.items():
        scored = score_task(
            model, task, "validation", contender.tokenizer.pad_token_id, cfg.finetune.eval_batch_size, precision
        )
        dev[name] = round(scored.primary(task.spec), 6)
        stats[name] = task.spec.kind.stats(scored.gold, scored.pred, task.spec)  # for the paired bootstrap
    np.savez(where / "dev_stats.npz", **stats)
    return {
        "arm": arm,
        "rung": rung,
        "seed": seed,
        "finetune_steps": summary["steps"],
        "finetune_seconds": summary["train_seconds"],
        "dev": dev,
        "dev_mean": round(float(np.mean(list(dev.values()))), 6),
    }


# ----------------------------------------------------------------------------- the tournament


def tournament_digest(cfg: Config, paths: Paths) -> str:
    """The tournament's work folder: the choice's digest and the fine-tuning and interval settings its arms use."""
    payload = {
        "choice": choice_digest(cfg, paths),
        "fine-tuning": cfg.finetune.model_dump(mode="json"),
        "bootstrap": [cfg.evaluate.bootstrap_resamples, cfg.evaluate.confidence],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def run_tournament(cfg: Config, paths: Paths, precision: Precision) -> dict[str, Any]:
    """Run (or resume) the tournament of ``adapt.arms``; return the record of every rung and the choice."""
    from pipeline.training.data import load_tasks
    from pipeline.training.trainer import step_plan

    ac = cfg.adapt
    digest = tournament_digest(cfg, paths)
    arena = Arena(cfg, paths, paths.adapt_checkpoints / digest, precision)
    start = time.perf_counter()
    tasks = load_tasks(cfg, paths, paths.task_features)
    final_steps = step_plan(cfg.finetune, tasks, cfg.finetune.max_steps).max_steps  # what finetune will train
    adapting = [a for a in ac.arms if a != "none"]
    rungs: list[dict[str, Any]] = []
    stopped = None
    for rung in range(ac.rungs):
        if rung and (stopped := over_budget(ac, rungs[-1], time.perf_counter() - start)):
            break
        entries = play_rung(arena, adapting, rung, final_steps)
        ranked = sorted(adapting, key=lambda a: entries[a]["dev_mean"], reverse=True)
        rungs.append(
            {
                "rung": rung,
                "pretrain_minutes": round(ac.rung_pretrain_minutes(rung), 3),
                "finetune_steps": ac.rung_finetune_steps(rung, final_steps),
                "arms": entries,
                "kept": ranked[: ac.survivors()[rung + 1]] if rung + 1 < ac.rungs else ranked[:1],
            }
        )
        adapting = rungs[-1]["kept"]
    specs = {name: task.spec for name, task in tasks.items()}
    decision = decide(arena, rungs[-1], specs)
    return {
        "strategy": "auto",
        "arms": list(ac.arms),
        "budget_minutes": ac.budget_minutes,
        "keep": ac.keep,
        "minutes_used": round((time.perf_counter() - start) / 60, 2),
        "stopped_early": stopped,
        "rungs": rungs,
        "digest": digest,
        **decision,
    }


def play_rung(arena: Arena, adapting: Sequence[str], rung: int, final_steps: int) -> dict[str, dict[str, Any]]:
    """Every adaptation arm of ``rung``, then ``none`` at equal minutes: each arm's seeds, their dev mean."""
    ac = arena.cfg.adapt
    steps = ac.rung_finetune_steps(rung, final_steps)
    entries: dict[str, dict[str, Any]] = {}
    for arm in adapting:
        encoder, seconds = pretrain_arm(arena, arm, rung)
        entries[arm] = summarise_arm([finished(arena, arm, rung, seed, steps, encoder) for seed in ac.seeds], seconds)
    # none: the adaptation arms' mean training seconds, as fine-tuning steps at their measured speed
    adapt_seconds = statistics.mean(e["pretrain_seconds"] for e in entries.values())
    per_step = statistics.median(
        r["finetune_seconds"] / r["finetune_steps"] for e in entries.values() for r in e["runs"]
    )
    extra = round(adapt_seconds / per_step)
    runs = [finished(arena, "none", rung, seed, steps + extra, None) for seed in ac.seeds]
    entries["none"] = summarise_arm(runs, 0.0) | {"extra_steps": extra}
    return entries


def finished(arena: Arena, arm: str, rung: int, seed: int, steps: int, encoder: Path | None) -> dict[str, Any]:
    """One (arm, rung, seed): its result file when it finished before, else trained and scored now."""
    result = arena.folder(arm, rung) / f"seed-{seed}" / "result.json"
    if (kept := finished_result(result)) is not None:
        return kept
    out = finetune_arm(arena, arm, rung, seed, steps, encoder)
    write_json(result, out)
    print(f"adapt: rung {rung + 1}, {ARM_NAMES[arm]}, seed {seed}: dev mean {out['dev_mean']:.4f}", file=sys.stderr)
    return out


def finished_result(result: Path) -> dict[str, Any] | None:
    """A finished run's result when it and its dev statistics read back whole; else ``None`` (never run, or damaged:
    then it is trained again, as a damaged checkpoint is set aside)."""
    if not result.exists():
        return None
    try:
        kept = json.loads(result.read_text(encoding="utf-8"))
        with np.load(result.parent / "dev_stats.npz") as stats:
            complete = set(stats.files) == set(kept["dev"]) and all(stats[f].size for f in stats.files)
        if complete and {"finetune_steps", "finetune_seconds", "dev_mean"} <= kept.keys():
            return dict(kept)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        pass
    print(f"adapt: {result} does not read back whole: that run is trained again", file=sys.stderr)
    return None


def summarise_arm(runs: list[dict[str, Any]], pretrain_seconds: float) -> dict[str, Any]:
    """An arm's rung: the seeds' dev mean (its score), the minutes it cost (pretraining + its fine-tuning runs)."""
    finetune_seconds = statistics.mean(r["finetune_seconds"] for r in runs)
    return {
        "dev_mean": round(statistics.mean(r["dev_mean"] for r in runs), 6),
        "dev": {t: round(statistics.mean(r["dev"][t] for r in runs), 6) for t in runs[0]["dev"]},
        "pretrain_seconds": round(pretrain_seconds, 1),
        "minutes": round((pretrain_seconds + finetune_seconds) / 60, 2),  # per seed: what equal compute compares
        "runs": runs,
    }


def over_budget(ac: AdaptConfig, last: dict[str, Any], elapsed: float) -> str | None:
    """Why the next rung is not started (its cost, from the last rung's measured minutes x the growth, would end
    past ``adapt.budget_minutes``), or ``None``."""
    growth = 1 / ac.keep
    cost = sum(e["minutes"] * len(ac.seeds) for e in last["arms"].values()) * growth  # upper bound: all arms again
    cost *= (len(last["kept"]) + 1) / len(last["arms"])  # the arms that go on, and none
    if elapsed / 60 + cost <= ac.budget_minutes:
        return None
    return (
        f"rung {last['rung'] + 2} not started: it would take ~{cost:.1f} min after {elapsed / 60:.1f}, past "
        f"adapt.budget_minutes ({ac.budget_minutes:g}); decided on rung {last['rung'] + 1}"  # rungs count from 1
    )


def decide(arena: Arena, last: dict[str, Any], specs: dict[str, Any]) -> dict[str, Any]:
    """The choice at the last rung played: its best adaptation arm if its dev mean beats ``none``'s, else none; the
    reason in one sentence, with the paired bootstrap interval of the dev mean difference (first seed's runs)."""
    arms = last["arms"]
    best = max((a for a in arms if a != "none"), key=lambda a: arms[a]["dev_mean"])
    seed = f"seed-{arena.cfg.adapt.seeds[0]}"
    delta = dev_delta(
        arena.cfg, arena.folder(best, last["rung"]) / seed, arena.folder("none", last["rung"]) / seed, specs
    )
    interval = f"{points(delta['delta'], signed=True)} {points_interval(delta['low'], delta['high'])}"
    budget = (
        f"at equal minutes (rung {last['rung'] + 1}: {last['pretrain_minutes']:g} min of adaptation + "
        f"{last['finetune_steps']} steps, against {last['finetune_steps'] + arms['none']['extra_steps']} steps alone)"
    )
    others = [
        f"{ARM_NAMES[a]} {points(arms[a]['dev_mean'] - arms['none']['dev_mean'], signed=True)}"
        for a in arms
        if a not in ("none", best)
    ]
    rest = f"; the others: {', '.join(others)}" if others else ""
    if arms[best]["dev_mean"] > arms["none"]["dev_mean"]:
        chosen = best
        reason = f"{ARM_NAMES[best]} won on dev by {interval} points of the mean primary metric {budget}{rest}"
    else:
        chosen = "none"
        reason = (
            f"fine-tuning alone won on dev: the best adaptation, {ARM_NAMES[best]}, trailed by {interval} points of "
            f"the mean primary metric {budget}{rest}; the pipeline fine-tunes the base model"
        )
    return {"chosen": chosen, "best_adaptation": best, "dev_delta": delta, "reason": reason + "."}


def dev_delta(cfg: Config, arm_dir: Path, none_dir: Path, specs: dict[str, Any]) -> dict[str, float]:
    """Paired bootstrap CI of an arm minus ``none`` in the dev mean primary metric (their ``dev_stats.npz``, the
    first seed's), the tasks resampled independently, the two arms paired within a task."""
    from pipeline.tasks.metrics import bootstrap_mean_delta, primary_metric

    with np.load(arm_dir / "dev_stats.npz") as a, np.load(none_dir / "dev_stats.npz") as b:
        paired = [(a[name], b[name], primary_metric(spec.kind, spec)) for name, spec in specs.items()]
    found = bootstrap_mean_delta(paired, cfg.evaluate.bootstrap_resamples, cfg.seed, cfg.evaluate.confidence)
    return {k: float(found[k]) for k in ("delta", "low", "high")}
