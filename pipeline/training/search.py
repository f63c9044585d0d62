"""Fine-tuning settings chosen on the dev split: one Optuna study per model (the search stage).

Each model that fine-tuning trains (the adapted encoder, the un-adapted baseline) gets its own
study, so each is compared at the settings its own dev split prefers. A trial fine-tunes the model
with the trial's values of ``search.space`` and ``search.task_space`` (numeric ``finetune`` settings, and per-task
sampling weights) and scores it by the best dev mean primary metric, the number early stopping and
the finetune stage watch. The first trial of each study is the settings of params.yaml, so the
choice is never worse on dev than no search. Cheap trials first: with ``pruner: median`` a trial
whose dev score falls below the median of the earlier trials at the same step stops there (Optuna's
``MedianPruner``; its value is then never chosen). A trial that diverges (NaN loss) fails alone.

Each trial is a nested MLflow run of the search stage's run (its values as ``search.*`` params, its
training curves): the Trainer's MLflow callback logs into the run
:func:`pipeline.training.trainer.train` opens, which optuna-integration's ``MLflowCallback``
cannot do (it opens its run after the trial, so the curves would land elsewhere).
The chosen values go to ``data/search/chosen.json``; finetune reads them (:func:`chosen_config`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.core.config import Config
from pipeline.core.errors import DataError, NonFiniteLoss
from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.sections.finetune import FinetuneConfig
from pipeline.core.sections.search import SearchConfig
from pipeline.training.contenders import TrainPlace, adapted_contender, baseline_contender, train_contender
from pipeline.training.data import load_tasks

CHOSEN_FILE = "chosen.json"


def current_value(fc: FinetuneConfig, key: str) -> float | int:
    """The value params.yaml gives the setting behind a ``search.space`` key."""
    parts = key.split(".")[1:]
    return getattr(fc.task(parts[1]), parts[2]) if parts[0] == "tasks" else getattr(fc, parts[0])


def apply_values(fc: FinetuneConfig, values: dict[str, float | int]) -> FinetuneConfig:
    """``fc`` with ``{"finetune.<key>" | "finetune.tasks.<task>.<key>": value}`` set, validated again."""
    data = fc.model_dump(mode="python")
    for key, value in values.items():
        parts = key.split(".")[1:]
        if parts[0] == "tasks":
            data["tasks"].setdefault(parts[1], {})[parts[2]] = value
        else:
            data[parts[0]] = value
    return FinetuneConfig.model_validate(data)


def with_values(cfg: Config, values: dict[str, float | int]) -> Config:
    """The whole configuration with the fine-tuning values of one trial (or of the choice)."""
    return cfg.model_copy(update={"finetune": apply_values(cfg.finetune, values)}) if values else cfg


def search_digest(cfg: Config) -> str:
    """What a choice was made under: the search and fine-tuning settings and the seed (a change makes it stale)."""
    payload = {"search": cfg.search.model_dump(mode="json"), "finetune": cfg.finetune.model_dump(mode="json")}
    return hashlib.sha256(json.dumps({**payload, "seed": cfg.seed}, sort_keys=True).encode()).hexdigest()[:16]


def default_values(sc: SearchConfig, fc: FinetuneConfig) -> dict[str, float | int]:
    """params.yaml's values of the searched settings, clipped into their ranges (the first trial)."""
    out: dict[str, float | int] = {}
    for key, r in sc.ranges().items():
        value = min(max(current_value(fc, key), r.low), r.high)
        out[key] = round(value) if sc.is_integer(key) else float(value)
    return out


def suggest(trial: Any, sc: SearchConfig) -> dict[str, float | int]:
    """A trial's values of every ``search.space`` setting."""
    values: dict[str, float | int] = {}
    for key, r in sc.ranges().items():
        if sc.is_integer(key):
            values[key] = trial.suggest_int(key, round(r.low), round(r.high), log=r.log)
        else:
            values[key] = trial.suggest_float(key, float(r.low), float(r.high), log=r.log)
    return values


def dev_pruning_callback(trial: Any, warmup_evaluations: int) -> Any:
    """A TrainerCallback that reports every dev evaluation to ``trial`` and stops training once Optuna prunes it
    (after ``warmup_evaluations``); ``.pruned_at`` is then the step."""
    from transformers import TrainerCallback

    class DevPruning(TrainerCallback):
        pruned_at: int | None = None
        evaluations = 0

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
            value = (metrics or {}).get("eval_mean_primary")
            if value is None:
                return
            self.evaluations += 1
            trial.report(float(value), state.global_step)
            if self.evaluations > warmup_evaluations and trial.should_prune():
                self.pruned_at = state.global_step
                control.should_training_stop = True

    return DevPruning()


def make_contender(cfg: Config, paths: Paths, model: str) -> Any:
    """A fresh copy of the model to fine-tune (a trial trains its own, so no trial starts from another's weights)."""
    return adapted_contender(paths) if model == "adapted" else baseline_contender(cfg, paths)


@dataclass
class Study:
    """One model's Optuna study, its objective and the rows of its trials so far."""

    model: str
    study: Any
    objective: Callable[[Any], float]
    rows: list[dict[str, Any]]
    seconds: float = 0.0


def open_study(cfg: Config, paths: Paths, model: str, precision: Any) -> Study:
    """``model``'s study, its first trial enqueued with params.yaml's settings; no trial run yet."""
    import optuna

    sc = cfg.search
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2) if sc.pruner == "median" else optuna.pruners.NopPruner()
    study = optuna.create_study(
        study_name=f"adaptbert-{model}",
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=cfg.seed),
        pruner=pruner,
    )
    study.enqueue_trial(default_values(sc, cfg.finetune))
    rows: list[dict[str, Any]] = []

    def objective(trial: Any) -> float:
        values = suggest(trial, sc)
        trial_cfg = with_values(cfg, values)
        contender = make_contender(trial_cfg, paths, model)
        tasks = load_tasks(trial_cfg, paths, contender.tokenized)
        pruning = dev_pruning_callback(trial, sc.pruner_warmup_evaluations)
        folder = paths.search_checkpoints / model / f"trial-{trial.number}"
        shutil.rmtree(folder, ignore_errors=True)  # a trial always starts fresh
        place = TrainPlace(
            folder / "checkpoints",
            folder / "curves",
            f"search-{model}-trial-{trial.number}",
            stage="search",
            callbacks=(pruning,),
            run_params=tuple((f"search.{k}", str(v)) for k, v in values.items()),
        )
        row: dict[str, Any] = {"trial": trial.number, "values": values, "state": "failed"}
        rows.append(row)
        start = time.perf_counter()
        try:
            _, summary = train_contender(trial_cfg, paths, contender, tasks, precision, place=place)
        except NonFiniteLoss as err:  # a failed trial (never chosen): our line, not Optuna's logged traceback
            row["state"] = "diverged"
            row["seconds"] = round(time.perf_counter() - start, 1)
            print_trial(model, row, sc.trials, f" ({str(err)[:160]})")
            raise
        finally:
            row["seconds"] = round(time.perf_counter() - start, 1)
            shutil.rmtree(folder, ignore_errors=True)  # trials keep nothing but their numbers (and MLflow runs)
        row |= {"steps": summary["steps"], "dev_mean_primary": summary["best_dev_mean_primary"]}
        row["state"] = "pruned" if pruning.pruned_at is not None else "complete"
        print_trial(model, row, sc.trials)
        if pruning.pruned_at is not None:
            raise optuna.TrialPruned(f"below the median at step {pruning.pruned_at}")
        return float(summary["best_dev_mean_primary"])

    return Study(model, study, objective, rows)


def run_trial(s: Study) -> None:
    """One more trial of ``s`` (a diverging one is recorded as failed, and the search goes on)."""
    start = time.perf_counter()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a caught failure is logged with its traceback at WARNING
    s.study.optimize(s.objective, n_trials=1, catch=(NonFiniteLoss,))
    s.seconds += time.perf_counter() - start


def study_result(s: Study, cfg: Config, paths: Paths) -> dict[str, Any]:
    """The chosen values of ``s`` and their dev score, with every trial's row; ``search-failed`` if none finished."""
    import optuna

    complete = [t for t in s.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise DataError(
            paths.search_report,
            None,
            "search-failed",
            f"no trial of the {s.model} model finished ({len(s.study.trials)} tried: {[r['state'] for r in s.rows]}); "
            "narrow search.space (a learning rate that diverges?) or give it more trials",
        )
    best = s.study.best_trial
    return {
        "chosen": {k: best.params[k] for k in cfg.search.ranges()},
        "chosen_trial": best.number,
        "chosen_dev_mean_primary": round(float(best.value), 5),
        "default_dev_mean_primary": s.rows[0].get("dev_mean_primary") if s.rows[0]["state"] == "complete" else None,
        "trials": s.rows,
        "seconds": round(s.seconds, 1),
    }


def run_studies(cfg: Config, paths: Paths, models: Sequence[str], precision: Any) -> dict[str, dict[str, Any]]:
    """Search each model's settings on dev, one trial of every model in turn (rounds).

    Rounds keep the comparison fair under a time budget: every model gets the same number of trials,
    whichever trains faster or however loaded the machine is (one study after the other, the budget let
    a fast baseline run three trials where the adapted model ran two). ``search.budget_minutes`` is per
    model: no round starts after ``budget_minutes x len(models)`` minutes; the first always runs.
    """
    sc = cfg.search
    studies = [open_study(cfg, paths, model, precision) for model in models]
    budget_s = sc.budget_minutes * 60 * len(studies) if sc.budget_minutes else None
    start = time.perf_counter()
    for _ in range(sc.trials):
        if budget_s is not None and time.perf_counter() - start >= budget_s:
            break
        for s in studies:
            run_trial(s)
    return {s.model: study_result(s, cfg, paths) for s in studies}


def describe_values(values: dict[str, float | int]) -> str:
    """``learning_rate=0.0003, max_steps=439``: steps as integers, rates to 3 significant digits."""
    return ", ".join(
        f"{k.removeprefix('finetune.')}={v if isinstance(v, int) else format(v, '.3g')}" for k, v in values.items()
    )


def print_trial(model: str, row: dict[str, Any], trials: int, why: str = "") -> None:
    """One console line per finished (or diverged: ``why``) trial."""

    values = describe_values(row["values"])
    score = f"dev mean primary {row['dev_mean_primary']} after {row['steps']} steps " if "steps" in row else ""
    print(
        f"search ({model}): trial {row['trial'] + 1}/{trials} {row['state']}{why}: {score}({values}; "
        f"{row['seconds']} s)",
        file=sys.stderr,
    )


def write_chosen(path: Path, cfg: Config, studies: dict[str, dict[str, Any]]) -> None:
    """``data/search/chosen.json``: the values each model fine-tunes with, and the settings they were chosen under."""
    record: dict[str, Any] = {"enabled": cfg.search.enabled, "models": {m: s["chosen"] for m, s in studies.items()}}
    if cfg.search.enabled:  # off, the file stays the same whatever the settings: finetune does not re-run for them
        record["digest"] = search_digest(cfg)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def chosen_config(cfg: Config, paths: Paths, model: str) -> tuple[Config, dict[str, Any] | None]:
    """The configuration ``model`` fine-tunes with: params.yaml, with the search's choice when ``search.enabled``
    (and that choice, else ``None``). A choice made under other settings is refused, naming the stage to re-run."""
    if not cfg.search.enabled:
        return cfg, None
    path = paths.search / CHOSEN_FILE
    record = read_report(path)  # missing, truncated or not an object: an error naming the stage
    if record.get("digest") != search_digest(cfg) or not record.get("enabled"):
        raise DataError(
            path,
            None,
            "stale-search",
            "it was chosen under other search, finetune or seed settings than params.yaml's: run the search stage "
            "again (dvc repro search)",
        )
    values = (record.get("models") or {}).get(model)
    if not values:
        return cfg, None
    unknown = sorted(set(values) - set(cfg.search.ranges()))
    if unknown:  # a hand edit: the digest says these settings were searched, so only their keys can be here
        raise DataError(
            path, None, "bad-search-choice", f"models.{model}: {unknown} are not searched; dvc repro search"
        )
    try:
        return with_values(cfg, values), values
    except ValidationError as err:  # a hand-edited value out of its range
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise DataError(
            path,
            None,
            "bad-search-choice",
            f"models.{model}: not valid finetune settings ({problems}); dvc repro search",
        ) from None
