"""Fine-tuning recipe study: arms of fine-tuning settings, each trained from one encoder with several seeds, on dev.

    python -m studies.finetune_recipe studies/biomed_recipe.yaml

Where ``studies.dapt_study`` compares encoders under one recipe, this compares recipes on one encoder (the
un-adapted base model by default: the baseline is half of every verdict, so its fine-tuning must be as good as the
model class allows before DAPT is judged against it). Each arm is a set of ``finetune.*`` overrides on top of the
profile; every arm is trained with every seed and scored on the **dev** splits only (the best checkpoint's primary
metric per task, token tasks decoded both ways: ``viterbi`` and ``argmax``). Test is never read: a recipe chosen here
is reported on test once, by the pipeline. Arms are compared with the first arm, paired by seed (mean difference and
its Student-t interval). Runs go ``parallel`` at a time, each on ``cores // parallel`` threads (two runs of one
thread do ~1.5x the steps of one of two on 2 cores, docs/speed.md).

Results: ``reports/study/<name>.md`` and ``<name>.json`` (every run's numbers, its steps, best step and seconds).
Work files in ``.study/<name>/``; a finished run is not trained again (its result file is kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.core.errors import ConfigError
from pipeline.core.io import write_json, write_text
from studies.dapt_study import ROOT, load_spec, mean_std, prepare_data, study_config, t_interval


class RecipeSpec(BaseModel):
    """``studies/<name>.yaml`` of a recipe study (strict: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")
    profile: str | None  # profiles/<profile>.yaml: data, tasks and the starting recipe
    encoder: Literal["baseline"] = "baseline"  # the un-adapted base model (the adapted one needs a pretraining run)
    seeds: list[int] = Field(min_length=1)
    tasks: list[str] | None = None  # a subset of the declared tasks (null: all)
    overrides: dict[str, Any] = {}  # for every arm alike
    arms: dict[str, dict[str, Any]] = Field(min_length=1)  # name -> finetune.* overrides; the first is the reference
    parallel: int = Field(default=2, ge=1)  # runs at a time

    @field_validator("arms")
    @classmethod
    def _finetune_keys(cls, arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, keys in arms.items():
            wrong = [k for k in keys if not k.startswith("finetune.")]
            if wrong:
                raise ValueError(f"arm '{name}': keys must start with 'finetune.', got {wrong}")
        return arms


def load_recipe_spec(path: Path) -> RecipeSpec:
    return load_spec(path, RecipeSpec)


def result_file(work: Path, arm: str, seed: int) -> Path:
    return work / "runs" / f"{arm}-seed{seed}.json"


def train_one(spec_path: Path, root: Path, arm: str, seed: int, work: Path, threads: int) -> dict[str, Any]:
    """One arm and seed, in a process of its own (``threads`` torch threads); its result file, or the kept one."""
    out = result_file(work, arm, seed)
    if out.exists():
        return json.loads(out.read_text(encoding="utf-8"))
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    command = [
        sys.executable,
        "-m",
        "studies.finetune_recipe",
        str(spec_path),
        "--root",
        str(root),
        "--workdir",
        str(work),
    ]
    command += ["--one", arm, str(seed), str(threads)]
    with open(log, "w", encoding="utf-8") as fh:
        done = subprocess.run(command, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"arm '{arm}' seed {seed} failed (exit {done.returncode}); see {log}")
    return json.loads(out.read_text(encoding="utf-8"))


def run_one(spec: RecipeSpec, root: Path, arm: str, seed: int, work: Path, threads: int) -> None:
    """Fine-tune the encoder with ``arm``'s settings and ``seed``; write its dev scores (``--one``, a child process)."""
    import torch

    from pipeline.core.paths import Paths
    from pipeline.modelling.precision import resolve_precision
    from pipeline.training.contenders import TrainPlace, baseline_contender, train_contender
    from pipeline.training.data import load_tasks
    from pipeline.training.multitask import predict_logits

    torch.set_num_threads(threads)
    cfg = study_config(spec, root, {**spec.arms[arm], "seed": seed})  # type: ignore[arg-type]  (+ its overrides)
    data = Paths(work / "data")
    precision = resolve_precision(cfg.precision)
    contender = baseline_contender(cfg, data)
    tasks = load_tasks(cfg, data, contender.tokenized)
    tasks = {n: t for n, t in tasks.items() if spec.tasks is None or n in spec.tasks}
    folder = work / "train" / f"{arm}-seed{seed}"
    place = TrainPlace(folder / "checkpoints", folder / "curves", f"recipe-{arm}-{seed}", stage="recipe")
    start = time.perf_counter()
    model, summary = train_contender(cfg, data, contender, tasks, precision, place=place)
    seconds = time.perf_counter() - start
    dev: dict[str, float] = {}
    pad = contender.tokenizer.pad_token_id
    for name, task in tasks.items():
        spec_t = task.spec
        logits = predict_logits(model, name, task.splits["validation"], pad, cfg.finetune.eval_batch_size, precision)
        features, rows = task.splits["validation"].to_list(), task.rows["validation"]
        gold = spec_t.kind.gold(rows, spec_t)
        ways = ("viterbi", "argmax") if spec_t.type == "token_classification" else (None,)
        for way in ways:
            settings = spec_t.settings if way is None else spec_t.settings.model_copy(update={"decoding": way})
            shown = dataclasses.replace(spec_t, settings=settings)
            pred = spec_t.kind.decode(features, logits, rows, shown)
            dev[name if way is None else f"{name}:{way}"] = spec_t.kind.score(gold, pred, shown)[spec_t.primary]
    result = {"arm": arm, "seed": seed, "dev": dev, "train_seconds": round(seconds, 1), **summary}
    write_json(result_file(work, arm, seed), result)


def primary_dev(result: dict[str, Any], tasks: list[str]) -> dict[str, float]:
    """Each task's dev primary metric as the pipeline decodes it (a token task: Viterbi), and their mean."""
    dev = result["dev"]
    scores = {t: dev.get(f"{t}:viterbi", dev.get(t, float("nan"))) for t in tasks}
    return {**scores, "mean": sum(scores.values()) / len(scores)}


def summarise(spec: RecipeSpec, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: mean ± std over seeds of each task and the mean, steps, minutes; paired deltas to the first arm."""
    tasks = sorted({k.split(":")[0] for r in results for k in r["dev"]})
    by = {(r["arm"], r["seed"]): primary_dev(r, tasks) for r in results}
    reference = next(iter(spec.arms))
    arms: dict[str, Any] = {}
    for arm in spec.arms:
        runs = [r for r in results if r["arm"] == arm]
        row: dict[str, Any] = {
            "seeds": [r["seed"] for r in runs],
            "steps": [r["steps"] for r in runs],
            "best_step": [r["best_step"] for r in runs],
            "planned_epochs": runs[0].get("planned_epochs") if runs else None,
            "minutes": round(sum(r["train_seconds"] for r in runs) / max(len(runs), 1) / 60, 1),
        }
        for key in [*tasks, "mean"]:
            row[key] = mean_std([by[(arm, r["seed"])][key] for r in runs])
        decodings = [k for k in (runs[0]["dev"] if runs else {}) if k.endswith(":argmax")]
        for key in decodings:  # what Viterbi decoding adds over each word's own best tag, same runs
            task = key.split(":")[0]
            row[f"{task} viterbi - argmax"] = mean_std([r["dev"][f"{task}:viterbi"] - r["dev"][key] for r in runs])
        if arm != reference:
            paired = [s for s in row["seeds"] if (reference, s) in by]
            for key in [*tasks, "mean"]:
                diffs = [by[(arm, s)][key] - by[(reference, s)][key] for s in paired]
                row[f"delta {key}"] = (mean_std(diffs)[0], *t_interval(diffs)) if diffs else None
        arms[arm] = row
    return {"tasks": tasks, "reference": reference, "arms": arms}


def pts(x: float) -> str:
    return f"{100 * x:.1f}"


def to_markdown(name: str, spec: RecipeSpec, summary: dict[str, Any], meta: dict[str, Any]) -> str:
    tasks, ref = summary["tasks"], summary["reference"]
    head = ["arm", *tasks, "mean", f"mean - {ref} [95% t-interval]", "steps", "planned epochs", "minutes per run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, row in summary["arms"].items():
        cells = [f"{pts(row[k][0])} ± {pts(row[k][1])}" for k in [*tasks, "mean"]]
        delta = row.get("delta mean")
        shown = f"{100 * delta[0]:+.1f} [{100 * delta[1]:+.1f}, {100 * delta[2]:+.1f}]" if delta else "(reference)"
        epochs = row["planned_epochs"] or {}
        planned = ", ".join(f"{t} {e:.1f}" for t, e in epochs.items())
        steps = "/".join(str(s) for s in row["steps"])
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {shown} | {steps} | {planned} | {row['minutes']} |")
    decoding = [
        f"- {arm}: {k.replace(' viterbi - argmax', '')} Viterbi - argmax {100 * v[0]:+.2f} ± {100 * v[1]:.2f} points"
        for arm, row in summary["arms"].items()
        for k, v in row.items()
        if k.endswith("viterbi - argmax")
    ]
    arms = "\n".join(
        f"- `{arm}`: {json.dumps(over) if over else 'the profile as it is'}" for arm, over in spec.arms.items()
    )
    return f"""# Fine-tuning recipe study: {name}

Encoder: {spec.encoder} (profile `{spec.profile}`), seeds {spec.seeds}; dev splits only (mean ± std over seeds of the
best checkpoint's primary metric; token tasks decoded with Viterbi, as the pipeline does). Machine: {meta["device"]},
{meta["cores"]} cores, {spec.parallel} run(s) at a time.

{chr(10).join(lines)}

Arms (on top of the profile{", and " + json.dumps(spec.overrides) if spec.overrides else ""}):
{arms}

Decoding, the same models scored both ways:
{chr(10).join(decoding) or "- no token classification task"}
"""


def run_study(spec_path: Path, root: Path = ROOT, work: Path | None = None, out: Path | None = None) -> dict[str, Any]:
    """Every arm with every seed (a finished run kept), then the summary: ``<out>/<name>.md`` and ``.json``."""
    spec = load_recipe_spec(spec_path)
    name = spec_path.stem
    work = (work or root / ".study" / name).resolve()
    prepare_data(spec, root, work)  # type: ignore[arg-type]  (the fields study_config reads: profile, overrides)
    threads = max(1, len(os.sched_getaffinity(0)) // spec.parallel)
    jobs = [(arm, seed) for seed in spec.seeds for arm in spec.arms]
    with ThreadPoolExecutor(spec.parallel) as pool:
        results = list(pool.map(lambda job: train_one(spec_path, root, job[0], job[1], work, threads), jobs))
    from studies.dapt_study import _device

    meta = {"device": _device(), "cores": len(os.sched_getaffinity(0))}
    summary = summarise(spec, results)
    out = out or root / "reports" / "study"
    write_json(out / f"{name}.json", {"spec": spec.model_dump(), "meta": meta, "summary": summary, "runs": results})
    write_text(out / f"{name}.md", to_markdown(name, spec, summary, meta))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="studies/<name>.yaml")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project root (params.yaml, profiles/)")
    parser.add_argument("--workdir", type=Path, default=None, help="work files (default .study/<name>/)")
    parser.add_argument("--out", type=Path, default=None, help="where the .md and .json go (default reports/study/)")
    parser.add_argument("--one", nargs=3, metavar=("ARM", "SEED", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        if args.one:
            arm, seed, threads = args.one
            spec = load_recipe_spec(args.spec)
            work = (args.workdir or args.root / ".study" / args.spec.stem).resolve()
            run_one(spec, args.root.resolve(), arm, int(seed), work, int(threads))
        else:
            run_study(args.spec.resolve(), args.root.resolve(), args.workdir, args.out)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
