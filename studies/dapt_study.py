"""Domain-adaptation study: the same fine-tuning with and without DAPT, several seeds, per task.

    dvc repro studies/dvc.yaml                         # the biomed study, DVC-tracked (~90 min on 2 cores)
    python -m studies.dapt_study studies/biomed.yaml  # the same, without DVC

After Gururangan et al. (2020), "Don't Stop Pretraining": one recipe (a profile, e.g.
``profiles/biomed.yaml``, plus the study's ``overrides``), one fine-tuning budget, and these
encoders, each fine-tuned multi-task with every seed of ``seeds``:

- ``base``: the un-adapted base model;
- ``dapt@N``: masked-LM pretraining on the domain corpus for N steps, for every N in
  ``dapt_budgets`` (checkpoints of one pretraining run: the budget curve);
- ``dapt+vocab``: the same at the largest budget with the vocabulary extended by mined domain
  words (``vocab_extension``);
- ``tapt`` and ``dapt+tapt``: ``tapt_steps`` of masked-LM on the tasks' own training inputs (task-adaptive
  pretraining, the texts the pipeline's ``pretrain.task_text`` adds), from the base model and from the
  largest DAPT encoder (0 leaves both out);
- ``recipes``: named variants of plain DAPT at the largest budget: a pretraining recipe (its own
  DAPT run with ``pretrain`` overrides, e.g. MacBERT's n-gram masking with similar words) and/or a
  fine-tuning recipe (``finetune`` overrides, e.g. FGM). A recipe may ``choose`` one fine-tuning
  setting among candidates on the dev sets (first seed, best dev mean primary), then runs every
  seed with it. Recipes are compared with plain DAPT (same seeds, paired) as well as with ``base``.
  A recipe with ``pretrain.selection.mode: nearest`` runs the select stage first (kNN-TAPT); one with
  ``pretrain.task_text: true`` mixes the tasks' train inputs into its DAPT corpus, as the pipeline does. A recipe
  with ``equal_minutes: true`` pretrains for the minutes plain DAPT's run took instead of its steps (e.g.
  ``pretrain.objective: electra``, whose step costs more: a comparison at equal compute).

Every variant is fine-tuned with each fraction of ``label_fractions`` of every task's train examples
(label efficiency: how many labels adaptation is worth; a seeded subset per task and seed, the same for
every variant, a smaller fraction's inside a larger one's); the main table is the largest fraction.

Held-out MLM perplexity of every encoder on the same fixed masks of the corpus validation split;
the base model ships no MLM head, so its perplexity is measured after ``head_fit_steps`` steps
that train only a fresh head on the frozen encoder. Results: ``reports/study/<name>.{md,json,png}``
and an MLflow parent run (experiment ``adaptbert-study``) with a child per pretraining and per
variant and seed. Work files (data, checkpoints) stay in ``.study/<name>/``; a killed study resumes
from its checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.core.config import Config, load_config, yaml_load
from pipeline.core.errors import ConfigError
from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport

ROOT = Path(__file__).resolve().parents[1]
DAPT_ROOT = "dapt"  # under the work dir: plain DAPT's project (its checkpoints, report, encoder)


class Recipe(BaseModel):
    """A variant of plain DAPT at the largest budget: pretraining and/or fine-tuning overrides (dotted params)."""

    model_config = ConfigDict(extra="forbid")
    pretrain: dict[str, Any] = {}  # pretrain.* overrides: a DAPT run of its own (e.g. pretrain.masking: ngram)
    finetune: dict[str, Any] = {}  # finetune.* overrides for its fine-tuning (e.g. finetune.adversarial: fgm)
    choose: dict[str, list[Any]] = {}  # one finetune.* key -> candidates, chosen on the dev sets (first seed)
    # pretrain for the minutes plain DAPT's run took (its train_seconds), not its steps: a recipe whose step costs
    # more or less (e.g. pretrain.objective: electra) is compared at equal compute (at most EQUAL_MINUTES_CAP x steps)
    equal_minutes: bool = False

    @model_validator(mode="after")
    def _keys(self) -> Recipe:
        for section, keys in (("pretrain", self.pretrain), ("finetune", [*self.finetune, *self.choose])):
            wrong = [k for k in keys if not k.startswith(f"{section}.")]
            if wrong:
                raise ValueError(f"recipe {section} keys must start with '{section}.', got {wrong}")
        if self.equal_minutes and not self.pretrain:
            raise ValueError("equal_minutes: the recipe trains plain DAPT's encoder (no pretrain overrides)")
        if len(self.choose) > 1 or any(len(v) < 2 for v in self.choose.values()):
            raise ValueError(f"choose: one key with at least two candidates, got {self.choose}")
        return self


class StudySpec(BaseModel):
    """``studies/<name>.yaml``: what the study compares (strict: unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid")
    profile: str | None  # profiles/<profile>.yaml: data, tasks and the recipe (null: params.yaml as it is, the demo)
    seeds: list[int] = Field(min_length=1)  # fine-tuning seeds of every variant
    dapt_budgets: list[int] = Field(min_length=1)  # DAPT steps at which the encoder is fine-tuned
    head_fit_steps: int = Field(ge=1)  # head-only MLM steps on the frozen base encoder (its perplexity)
    vocab_extension: bool = True  # variant dapt+vocab
    tapt_steps: int = Field(ge=0, default=0)  # variants tapt and dapt+tapt (0: off)
    label_fractions: list[float] = [1.0]  # shares of each task's train examples every variant is fine-tuned on
    overrides: dict[str, Any] = {}  # dotted params for every variant alike (e.g. the fine-tuning budget)
    recipes: dict[str, Recipe] = {}  # variant name -> a recipe on top of plain DAPT at the largest budget

    @model_validator(mode="after")
    def _budgets_sorted(self) -> StudySpec:
        if self.dapt_budgets != sorted(set(self.dapt_budgets)) or self.dapt_budgets[0] < 1:
            raise ValueError(f"dapt_budgets {self.dapt_budgets}: distinct positive step counts in increasing order")
        fractions = self.label_fractions
        if not fractions or fractions != sorted(set(fractions)) or not all(0 < f <= 1 for f in fractions):
            raise ValueError(f"label_fractions {fractions}: distinct shares in (0, 1] in increasing order")
        return self


SpecT = TypeVar("SpecT", bound=BaseModel)


def load_spec(path: Path, kind: type[SpecT] = StudySpec) -> SpecT:  # type: ignore[assignment]  (the default is a SpecT)
    """A study's YAML spec validated as ``kind``; any problem is a ConfigError naming the file."""
    try:
        return kind.model_validate(yaml_load(path.read_text(encoding="utf-8")))
    except Exception as err:
        raise ConfigError(f"{path}: {err}") from None


@dataclass
class Encoder:
    """One variant's encoder, ready to fine-tune."""

    variant: str
    dapt_steps: int
    encoder_dir: Path
    tokenizer_dir: Path
    tokenized: Path  # its tokenized tasks (tasks.json + arrow files)
    perplexity: float | None
    comparable_ppl: bool  # same tokenization and masking (so the same masked inputs) as the base model
    finetune_overrides: dict[str, Any] = field(default_factory=dict)  # a recipe's fine-tuning settings
    reference: str | None = None  # the variant it is also compared with (a recipe: plain DAPT)
    selection: dict[str, Any] | None = None  # a recipe's dev-set choice: key, candidates' dev scores, chosen
    minutes: dict[str, float] | None = None  # an equal_minutes recipe: the minutes asked (plain DAPT's) and used


# ----------------------------------------------------------------------------- configs


# The study's DAPT trains on the corpus whatever its profile adapts with (biomed's is TAPT), and its TAPT variants make
# their own corpus of the task text: a recipe may still mix the task text in (pretrain.task_text: true).
CORPUS_TEXT = {"pretrain.corpus_text": True, "pretrain.task_text": False}


def study_config(spec: StudySpec, root: Path, extra: dict[str, Any] | None = None) -> Config:
    """params.yaml + profile + the study's overrides (+ ``extra``); the study logs to MLflow itself."""
    from pipeline.core.profiles import profile_overrides

    profile = {**profile_overrides(root, spec.profile), **CORPUS_TEXT}
    overrides = {**profile, **spec.overrides, **(extra or {}), "tracking.enabled": False}
    cfg = load_config(root / "params.yaml", overrides)
    return load_config(root / "params.yaml", {**overrides, **absolute_inputs(cfg, root)})


def absolute_inputs(cfg: Config, root: Path) -> dict[str, Any]:
    """Input paths (relative to the project root in params) made absolute: the study works in other roots."""

    def absolute(path: str | None) -> str | None:
        return path if path is None or Path(path).is_absolute() else str(root / path)

    ic = cfg.ingest.model_dump(mode="json")
    for source in ic["corpus"]["sources"]:
        if source["type"] == "files":
            source["path"] = absolute(source["path"])
    for task in ic["tasks"]:
        task["files"] = {split: absolute(f) for split, f in task["files"].items()}
    return {
        "ingest.corpus.sources": ic["corpus"]["sources"],
        "ingest.tasks": ic["tasks"],
        "tokenize.domain_terms": absolute(cfg.tokenize.domain_terms),
        "tokenize.jieba_user_dict": absolute(cfg.tokenize.jieba_user_dict),
    }


def pretrain_overrides(cfg: Config, steps: int, eval_every: int) -> dict[str, Any]:
    """A pretraining run of ``steps`` that evaluates (and keeps a checkpoint) every ``eval_every`` steps."""
    log = math.gcd(eval_every, cfg.pretrain.logging_steps)
    return {
        "pretrain.max_steps": steps,
        "pretrain.eval_steps": eval_every,
        "pretrain.save_steps": eval_every,
        "pretrain.logging_steps": log,
        "pretrain.save_total_limit": steps // eval_every + 1,
        "pretrain.warmup_steps": min(cfg.pretrain.warmup_steps, steps - 1),
    }


def linked_root(root: Path, shared: Paths) -> Paths:
    """A work root that reads the shared ingest outputs (corpus, tasks) through symlinks, with their validation stamp."""
    for name in ("corpus", "tasks"):
        link = root / "data" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(getattr(shared, name).resolve(), target_is_directory=True)
    paths = Paths(root)
    if shared.validated_stamp.exists():  # the same bytes passed validate in the shared root
        paths.validated_stamp.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared.validated_stamp, paths.validated_stamp)
    return paths


def slug(variant: str) -> str:
    """``dapt@100`` -> ``dapt-100``, ``dapt+vocab`` -> ``dapt-vocab``: for file and MLflow metric names."""
    return variant.replace("@", "-").replace("+", "-")


# ----------------------------------------------------------------------------- stages of the study


def prepare_data(spec: StudySpec, root: Path, work: Path) -> Paths:
    """Ingest, validate and tokenize (base vocabulary) once for every variant."""
    from pipeline.stages import ingest, tokenize, validate

    cfg = study_config(spec, root)
    paths = Paths(work / "data")
    if not paths.tokenize_report.exists():
        for stage in (ingest, validate, tokenize):
            stage.run(cfg, paths)
    return paths


def curve_perplexity(paths: Paths, step: int) -> float:
    """``eval_perplexity`` at ``step`` from a pretraining run's curves."""
    import csv

    curves = paths.pretrain_curves / "eval.csv"
    with open(curves, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["step"]) == step:
                return float(row["eval_perplexity"])
    raise RuntimeError(f"{curves}: no eval_perplexity at step {step}")


def pretrain_in(cfg: Config, paths: Paths, run_name: str) -> PretrainReport:
    """pretrain.run in ``paths`` (resumes from its checkpoints) inside an MLflow child run."""
    import mlflow

    from pipeline.stages import pretrain

    if paths.pretrain_report.exists() and paths.dapt.exists():
        return read_report(paths.pretrain_report, PretrainReport)
    with mlflow.start_run(run_name=run_name, nested=True):
        mlflow.set_tag("study.role", "pretrain")
        report = pretrain.run(cfg, paths)
        mlflow.log_metrics(
            {k: float(v) for k, v in report.as_json().items() if isinstance(v, int | float) and not isinstance(v, bool)}
        )
    return report


def base_encoder(spec: StudySpec, root: Path, data: Paths, work: Path) -> Encoder:
    """The un-adapted model; its perplexity with a head fitted on the frozen encoder."""
    from pipeline.modelling.models import resolve_base

    cfg = study_config(spec, root)
    k = spec.head_fit_steps
    # head_warmup_steps = k freezes the encoder for steps 1..k; the evaluation at step k sees the base encoder
    fit = study_config(
        spec,
        root,
        {
            **pretrain_overrides(cfg, k + 1, k),
            "pretrain.head_warmup_steps": k,
            "pretrain.save_steps": k + 1,
            "pretrain.logging_steps": 1,
            "pretrain.save_total_limit": 1,
        },
    )
    paths = linked_root(work / "base-head", data)
    copy_tokenized(data, paths)
    pretrain_in(fit, paths, "pretrain:base-head-only")
    source = Path(
        cfg.pretrain.base_model
        if cfg.pretrain.base_model == "scratch"
        else resolve_base(cfg.pretrain.base_model, "pretrain.base_model")
    )
    return Encoder("base", 0, source, data.tokenizer, data.task_features, curve_perplexity(paths, k), True)


def copy_tokenized(src: Paths, dst: Paths) -> None:
    """Point ``dst`` at ``src``'s tokenizer and tokenized data (read-only use)."""
    for a, b in ((src.tokenizer, dst.tokenizer), (src.tokenized, dst.tokenized)):
        b.parent.mkdir(parents=True, exist_ok=True)
        if not b.exists():
            b.symlink_to(a.resolve(), target_is_directory=True)
    dst.reports.mkdir(parents=True, exist_ok=True)
    if not dst.tokenize_report.exists():
        shutil.copy(src.tokenize_report, dst.tokenize_report)


def dapt_encoders(spec: StudySpec, root: Path, data: Paths, work: Path) -> list[Encoder]:
    """One DAPT run to the largest budget; its checkpoints at the smaller budgets."""
    cfg = study_config(spec, root)
    steps = spec.dapt_budgets[-1]
    every = math.gcd(*spec.dapt_budgets)
    run_cfg = study_config(spec, root, pretrain_overrides(cfg, steps, every))
    paths = linked_root(work / DAPT_ROOT, data)
    copy_tokenized(data, paths)
    pretrain_in(run_cfg, paths, "pretrain:dapt")
    out = []
    for n in spec.dapt_budgets:
        encoder = paths.dapt if n == steps else keep_checkpoint(paths, n)
        out.append(
            Encoder(f"dapt@{n}", n, encoder, data.tokenizer, data.task_features, curve_perplexity(paths, n), True)
        )
    return out


def keep_checkpoint(paths: Paths, step: int) -> Path:
    """A copy of pretraining checkpoint ``step`` (weights + config) outside the rotating checkpoint dir."""
    dst = paths.root / "models" / f"dapt-{step}"
    if not dst.exists():
        src = paths.pretrain_checkpoints / f"checkpoint-{step}"
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy(src / name, tmp / name)
        tmp.rename(dst)
    return dst


def vocab_encoder(spec: StudySpec, root: Path, data: Paths, work: Path) -> Encoder:
    """DAPT at the largest budget with the vocabulary extended by mined domain words."""
    from pipeline.stages import tokenize

    cfg = study_config(spec, root, {"tokenize.extend_vocab.enabled": True})
    steps = spec.dapt_budgets[-1]
    run_cfg = study_config(spec, root, {"tokenize.extend_vocab.enabled": True, **pretrain_overrides(cfg, steps, steps)})
    paths = linked_root(work / "dapt-vocab", data)
    if not paths.tokenize_report.exists():
        tokenize.run(cfg, paths)
    pretrain_in(run_cfg, paths, "pretrain:dapt+vocab")
    return Encoder(
        "dapt+vocab",
        steps,
        paths.dapt,
        paths.tokenizer,
        paths.task_features,
        curve_perplexity(paths, steps),
        False,
    )


def tapt_data(spec: StudySpec, root: Path, data: Paths, work: Path) -> Paths:
    """The tasks' train inputs (the pipeline's TAPT text, labels left out) as a corpus, tokenized once."""
    from pipeline.stages import tokenize
    from pipeline.tasks.encoding import task_train_inputs
    from pipeline.text.corpus_shards import corpus_shards, write_corpus_manifest, write_corpus_texts

    cfg = study_config(spec, root)
    paths = Paths(work / "tapt-data")
    if not paths.tokenize_report.exists():
        paths.corpus.mkdir(parents=True, exist_ok=True)
        texts = [text for _, text in task_train_inputs(data.tasks)]
        held_out = corpus_shards(data.corpus, "validation")  # the same held-out blocks
        for shard in held_out:
            (paths.corpus / shard.file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(data.corpus / shard.file, paths.corpus / shard.file)
        write_corpus_manifest(paths.corpus, [write_corpus_texts(paths.corpus, "train", texts), *held_out])
        if not (paths.root / "data" / "tasks").exists():
            (paths.root / "data" / "tasks").symlink_to(data.tasks.resolve(), target_is_directory=True)
        tokenize.run(cfg, paths, require_validation=False)  # a corpus derived from the validated tasks' train text
    return paths


def tapt_encoder(spec: StudySpec, root: Path, tapt: Paths, data: Paths, work: Path, start: Encoder) -> Encoder:
    """``tapt_steps`` of MLM on the tasks' train inputs, from ``start`` (the base model: ``tapt``; DAPT: ``dapt+tapt``)."""
    variant = "tapt" if start.variant == "base" else "dapt+tapt"
    cfg = study_config(spec, root)
    steps = spec.tapt_steps
    # the base variant starts from pretrain.base_model itself (a hub or local model, or scratch's seeded init)
    start_from = {} if start.variant == "base" else {"pretrain.base_model": str(start.encoder_dir.resolve())}
    run_cfg = study_config(spec, root, {**pretrain_overrides(cfg, steps, steps), **start_from})
    paths = Paths(work / slug(variant))
    copy_tokenized(tapt, paths)
    pretrain_in(run_cfg, paths, f"pretrain:{variant}")
    return Encoder(
        variant,
        start.dapt_steps,
        paths.dapt,
        data.tokenizer,
        data.task_features,
        curve_perplexity(paths, steps),
        True,
    )


# recipe keys after which its held-out perplexity is not comparable with plain DAPT's: other masked inputs, or
# (objective: electra) the perplexity of its small generator, not of the encoder
MASKED_INPUT_KEYS = (
    "pretrain.masking",
    "pretrain.mask_token",
    "pretrain.ngram_probs",
    "pretrain.mlm_probability",
    "pretrain.objective",
)
EQUAL_MINUTES_CAP = 4  # an equal_minutes recipe may run up to this many times plain DAPT's steps


def equal_minutes(work: Path, steps: int) -> dict[str, Any]:
    """The overrides that give a recipe plain DAPT's training minutes (read from its report) instead of its steps."""
    seconds = read_report(Paths(work / DAPT_ROOT).pretrain_report, PretrainReport).train_seconds
    if seconds is None:
        raise ConfigError(f"equal_minutes: plain DAPT's report in {work / DAPT_ROOT} holds no training seconds")
    return {"pretrain.budget_minutes": round(seconds / 60, 3), "pretrain.max_steps": EQUAL_MINUTES_CAP * steps}


def recipe_encoders(spec: StudySpec, root: Path, data: Paths, work: Path, dapt: Encoder) -> list[Encoder]:
    """One encoder per recipe: its own DAPT run when it overrides pretraining, else plain DAPT's; then its
    ``choose`` setting picked on the dev sets."""
    cfg = study_config(spec, root)
    steps = spec.dapt_budgets[-1]
    out = []
    for name, recipe in spec.recipes.items():
        enc = Encoder(
            name,
            steps,
            dapt.encoder_dir,
            data.tokenizer,
            data.task_features,
            dapt.perplexity,
            True,
            dict(recipe.finetune),
            reference=dapt.variant,
        )
        if recipe.pretrain:
            budget = equal_minutes(work, steps) if recipe.equal_minutes else {}
            run_cfg = study_config(spec, root, {**recipe.pretrain, **pretrain_overrides(cfg, steps, steps), **budget})
            paths = linked_root(work / slug(name), data)
            copy_tokenized(data, paths)
            select_blocks(run_cfg, paths)
            report = pretrain_in(run_cfg, paths, f"pretrain:{name}")
            enc.encoder_dir, enc.dapt_steps = paths.dapt, report.global_step
            enc.perplexity = report.adapted_perplexity if budget else curve_perplexity(paths, steps)
            if budget:
                used = round((report.train_seconds or 0.0) / 60, 2)
                enc.minutes = {"asked": budget["pretrain.budget_minutes"], "used": used}
            enc.comparable_ppl = not any(k in MASKED_INPUT_KEYS for k in recipe.pretrain)  # other masked inputs
        if recipe.choose:
            choose_on_dev(spec, root, data, work, enc, recipe)
        out.append(enc)
    return out


def select_blocks(cfg: Config, paths: Paths) -> None:
    """The select stage in a recipe's root, when its DAPT trains on the nearest blocks (kNN-TAPT)."""
    from pipeline.stages import select

    if cfg.pretrain.selection.mode == "nearest" and not paths.select_report.exists():
        select.run(cfg, paths)


def choose_on_dev(spec: StudySpec, root: Path, data: Paths, work: Path, enc: Encoder, recipe: Recipe) -> None:
    """Fine-tune each candidate of ``recipe.choose`` with the first seed; keep the best dev mean primary (the
    test scores of the candidates are never looked at). The winner's run counts as the recipe's first seed."""
    ((key, candidates),) = recipe.choose.items()
    seed, fraction = spec.seeds[0], spec.label_fractions[-1]
    dev: dict[str, float] = {}
    runs = {}
    for value in candidates:
        trial = Encoder(**{**enc.__dict__, "variant": f"{enc.variant}[{key}={value}]"})
        trial.finetune_overrides = {**enc.finetune_overrides, key: value}
        runs[str(value)] = finetune_and_test(spec, root, data, work, trial, seed, fraction)
        dev[str(value)] = runs[str(value)]["dev_mean_primary"]
    best = max(candidates, key=lambda v: dev[str(v)])
    enc.finetune_overrides[key] = best
    enc.selection = {"key": key, "dev_mean_primary": dev, "chosen": best, "seed": seed}
    result_file = result_path(work, enc.variant, seed, fraction)
    if not result_file.exists():  # the winner's run is the recipe's run at this seed
        result_file.parent.mkdir(parents=True, exist_ok=True)
        result_file.write_text(json.dumps({**runs[str(best)], "variant": enc.variant}, indent=1), encoding="utf-8")
    print(f"study: {enc.variant}: {key} chosen on dev: {best} (dev mean primary {dev})", flush=True)


def result_path(work: Path, variant: str, seed: int, fraction: float) -> Path:
    """Where one fine-tuning run's scores are kept (all the labels: ``runs/<variant>/seed-<seed>.json``)."""
    labels = "" if fraction == 1 else f"labels-{fraction:g}/"
    return work / "runs" / slug(variant) / f"{labels}seed-{seed}.json"


def finetune_and_test(
    spec: StudySpec, root: Path, data: Paths, work: Path, enc: Encoder, seed: int, fraction: float = 1.0
) -> dict[str, Any]:
    """Fine-tune ``enc`` multi-task with ``seed`` on ``fraction`` of each task's train examples (resumable) and
    score every test split."""
    from transformers import AutoTokenizer

    from pipeline.modelling.precision import resolve_precision
    from pipeline.training.contenders import Contender, baseline_contender, train_contender
    from pipeline.training.data import load_tasks, train_subset
    from pipeline.training.multitask import load_encoder, score_task

    result_file = result_path(work, enc.variant, seed, fraction)
    if result_file.exists():
        return json.loads(result_file.read_text(encoding="utf-8"))
    cfg = study_config(spec, root, {"seed": seed, "finetune.baseline": False, **enc.finetune_overrides})
    if enc.variant == "base":  # the base checkpoint (or, for pretrain.base_model: scratch, a seeded random init)
        contender = baseline_contender(cfg, data)
        contender.name = "model"
    else:
        contender = Contender(
            "model",
            load_encoder(enc.encoder_dir),
            AutoTokenizer.from_pretrained(enc.tokenizer_dir),
            enc.tokenized,
            str(enc.encoder_dir),
        )
    tasks = {name: train_subset(task, fraction, seed) for name, task in load_tasks(cfg, data, enc.tokenized).items()}
    precision = resolve_precision(cfg.precision)
    model, summary = train_contender(cfg, Paths(result_file.with_suffix("")), contender, tasks, precision)
    pad = contender.tokenizer.pad_token_id
    test = {}
    for name, task in tasks.items():
        scored = score_task(model, task, "test", pad, cfg.evaluate.batch_size, precision)
        test[name] = {
            "primary": task.spec.primary,
            "value": scored.primary(task.spec),
            "metrics": {k: v for k, v in scored.metrics.items() if isinstance(v, int | float)},
        }
    result = {
        "variant": enc.variant,
        "seed": seed,
        "label_fraction": fraction,
        "train_examples": {name: len(task.splits["train"]) for name, task in tasks.items()},  # features (QA: windows)
        "dapt_steps": enc.dapt_steps,
        "test": test,
        "train_seconds": summary["train_seconds"],
        "best_step": summary["best_step"],
        "dev_mean_primary": summary["best_dev_mean_primary"],
    }
    result_file.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result


def trivial_scores(spec: StudySpec, root: Path, data: Paths) -> dict[str, float]:
    """Each task's trivial baseline (majority class, all O, ...) on its primary metric."""
    from pipeline.tasks.registry import kind_of
    from pipeline.training.data import load_tasks

    cfg = study_config(spec, root)
    out = {}
    for name, task in load_tasks(cfg, data, data.task_features).items():
        kind = kind_of(task.spec.type)
        gold = kind.gold(task.rows["test"], task.spec)
        out[name] = float(
            kind.score(gold, kind.trivial(task.rows["train"], task.rows["test"], task.spec), task.spec)[
                task.spec.primary
            ]
        )
    return out


# ----------------------------------------------------------------------------- statistics and report


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student-t critical value: P(|T| <= q) = confidence for T with ``df`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def t_interval(diffs: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean of paired (same-seed) differences (exact quantile, any df)."""
    m, s = mean_std(diffs)
    half = t_quantile(confidence, len(diffs) - 1) * s / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    return m - half, m + half


def summarise(results: list[dict[str, Any]], encoders: list[Encoder], trivial: dict[str, float]) -> dict[str, Any]:
    """Per variant and task: mean ± std over seeds, and the paired difference to ``base``."""
    tasks = sorted(results[0]["test"])
    by_variant: dict[str, dict[int, dict[str, float]]] = {}
    for r in results:
        scores = {t: r["test"][t]["value"] for t in tasks}
        scores["mean"] = statistics.fmean(scores.values())
        by_variant.setdefault(r["variant"], {})[r["seed"]] = scores
    rows = []
    for enc in encoders:
        seeds = by_variant[enc.variant]
        row: dict[str, Any] = {
            "variant": enc.variant,
            "dapt_steps": enc.dapt_steps,
            "perplexity": enc.perplexity,
            "perplexity_comparable": enc.comparable_ppl,
            "seeds": sorted(seeds),
            "reference": enc.reference,
            "finetune_overrides": enc.finetune_overrides,
            "selection": enc.selection,
            "minutes": enc.minutes,
        }
        for t in [*tasks, "mean"]:
            values = [seeds[s][t] for s in sorted(seeds)]
            m, sd = mean_std(values)
            row[t] = {"mean": m, "std": sd, "values": values}
            if enc.variant != "base":
                base = by_variant["base"]
                diffs = [seeds[s][t] - base[s][t] for s in sorted(seeds) if s in base]
                lo, hi = t_interval(diffs)
                row[t]["delta"] = {"mean": statistics.fmean(diffs), "ci95": [lo, hi], "per_seed": diffs}
            if enc.reference:  # a recipe against plain DAPT, paired by seed
                ref = by_variant[enc.reference]
                diffs = [seeds[s][t] - ref[s][t] for s in sorted(seeds) if s in ref]
                lo, hi = t_interval(diffs)
                row[t]["delta_ref"] = {"mean": statistics.fmean(diffs), "ci95": [lo, hi], "per_seed": diffs}
        rows.append(row)
    primaries = {t: results[0]["test"][t]["primary"] for t in tasks}
    return {"tasks": tasks, "primary": primaries, "trivial": trivial, "rows": rows}


def summarise_fractions(
    spec: StudySpec, results: list[dict[str, Any]], encoders: list[Encoder], trivial: dict[str, float]
) -> dict[str, Any]:
    """``summarise`` of the largest label fraction, plus (with several) every fraction's rows under
    ``label_efficiency``: ``[{"fraction": f, "rows": [...]}, ...]``."""

    def at(fraction: float) -> list[dict[str, Any]]:
        return [r for r in results if r.get("label_fraction", 1.0) == fraction]  # older result files: all labels

    full = spec.label_fractions[-1]
    summary = summarise(at(full), encoders, trivial)
    summary["label_fraction"] = full
    summary["label_efficiency"] = (
        [{"fraction": f, "rows": summarise(at(f), encoders, trivial)["rows"]} for f in spec.label_fractions]
        if len(spec.label_fractions) > 1
        else []
    )
    return summary


def fmt(x: float) -> str:
    return f"{100 * x:.1f}"


def verdict(summary: dict[str, Any], rows: list[dict[str, Any]] | None = None, where: str = "") -> list[str]:
    """Plain sentences: which variants beat the base model (and recipes plain DAPT) beyond the seed noise, per
    task (``rows``: another label fraction's, ``where`` saying which, e.g. " with 10% of the labels")."""
    lines = []
    for row in (summary["rows"] if rows is None else rows)[1:]:
        comparisons = [("delta", "base")] + ([("delta_ref", row["reference"])] if row.get("reference") else [])
        for key, other in comparisons:
            for t in [*summary["tasks"], "mean"]:
                d = row[t][key]
                lo, hi = d["ci95"]
                sign = "better than" if lo > 0 else "worse than" if hi < 0 else "not distinguishable from"
                lines.append(
                    f"- {row['variant']}{where} on {t}: {sign} {other} ({'+' if d['mean'] >= 0 else ''}{fmt(d['mean'])} "
                    f"points, 95% t-interval over seeds [{fmt(lo)}, {fmt(hi)}])"
                )
    return lines


def signed_interval(d: dict[str, Any] | None) -> str:
    """``+1.2 [-0.3, 2.7]`` (points) for a paired difference, empty when there is none."""
    if d is None:
        return ""
    return f"{'+' if d['mean'] >= 0 else ''}{fmt(d['mean'])} [{fmt(d['ci95'][0])}, {fmt(d['ci95'][1])}]"


def recipe_notes(summary: dict[str, Any]) -> list[str]:
    """What each recipe changed, and the setting chosen on the dev sets with the candidates' dev scores."""
    lines = []
    for row in summary["rows"]:
        if not row.get("reference"):
            continue
        settings = ", ".join(f"`{k}: {v}`" for k, v in row["finetune_overrides"].items()) or "plain fine-tuning"
        line = f"- {row['variant']}: fine-tuned with {settings}"
        sel = row.get("selection")
        if sel:
            dev = ", ".join(f"{v}: {fmt(s)}" for v, s in sel["dev_mean_primary"].items())
            line += f"; `{sel['key']}` chosen on the dev sets (seed {sel['seed']}, dev mean primary {dev})"
        if row.get("minutes"):
            m = row["minutes"]
            line += (
                f"; pretrained for plain DAPT's {m['asked']:g} minutes ({m['used']:g} used: {row['dapt_steps']} steps "
                "planned from its own step time)"
            )
        lines.append(line + ".")
    return lines


def label_efficiency_section(summary: dict[str, Any]) -> str:
    """The label-fraction table (test points, mean ± std over seeds, Δ vs base with its t-interval) and its reading."""
    if not summary["label_efficiency"]:
        return ""
    tasks = summary["tasks"]
    head = "| train labels | variant | " + " | ".join(f"{t} | Δ {t} vs base" for t in [*tasks, "mean"]) + " |"
    lines = [head, "|---:|---|" + "---:|---:|" * (len(tasks) + 1)]
    reading = []
    for level in summary["label_efficiency"]:
        share = f"{level['fraction']:.0%}"
        for row in level["rows"]:
            cells = [
                f"{fmt(row[t]['mean'])} ± {fmt(row[t]['std'])} | {signed_interval(row[t].get('delta'))}"
                for t in [*tasks, "mean"]
            ]
            lines.append(f"| {share} | {row['variant']} | " + " | ".join(cells) + " |")
        if level["fraction"] != summary["label_fraction"]:  # the largest fraction's reading is the main one
            reading += verdict(summary, level["rows"], f" with {share} of the labels")
    return f"""
## Label efficiency

Every variant fine-tuned on a share of each task's train examples (the same seeded subset for every
variant at a seed; the smaller shares inside the larger), with the same steps and dev-based early
stopping; test points, mean ± std over seeds, Δ to `base` paired by seed with its 95% t-interval.
The plot's lower row shows the same.

{chr(10).join(lines)}

{chr(10).join(reading)}
"""


def to_markdown(name: str, spec: StudySpec, summary: dict[str, Any], meta: dict[str, Any]) -> str:
    tasks = summary["tasks"]
    head = (
        "| variant | DAPT steps | held-out perplexity | "
        + " | ".join(f"{t} {summary['primary'][t]}" for t in tasks)
        + " | mean | Δ mean vs base | Δ mean vs plain DAPT |"
    )
    lines = [head, "|---|---:|---:|" + "---:|" * (len(tasks) + 3)]
    lines.append(
        "| trivial baseline | | | "
        + " | ".join(fmt(summary["trivial"][t]) for t in tasks)
        + " | "
        + fmt(statistics.fmean(summary["trivial"].values()))
        + " | | |"
    )
    for row in summary["rows"]:
        ppl = (
            "n/a"
            if row["perplexity"] is None
            else f"{row['perplexity']:.2f}" + ("" if row["perplexity_comparable"] else " *")
        )
        cells = [f"{fmt(row[t]['mean'])} ± {fmt(row[t]['std'])}" for t in [*tasks, "mean"]]
        delta, delta_ref = signed_interval(row["mean"].get("delta")), signed_interval(row["mean"].get("delta_ref"))
        lines.append(
            f"| {row['variant']} | {row['dapt_steps']} | {ppl} | " + " | ".join(cells) + f" | {delta} | {delta_ref} |"
        )
    notes = recipe_notes(summary)
    recipe_source = f"Profile `profiles/{spec.profile}.yaml`" if spec.profile else "`params.yaml` as it is (the demo)"
    seeds = ", ".join(str(s) for s in spec.seeds)
    return f"""# DAPT study: {name}

Generated by `{meta["command"]}` on {meta["date"]} ({meta["machine"]}), {meta["minutes"]:.0f} minutes.
{recipe_source} with the study overrides `{json.dumps(spec.overrides)}`; every
variant is fine-tuned multi-task with the same recipe and budget, seeds {seeds}.

Test scores in points (metric x 100), mean ± sample std over the {len(spec.seeds)} seeds. Δ: mean of
the per-seed differences to `base` (same seed) with a 95% Student-t interval over seeds: it
covers fine-tuning variance only (one pretraining run per variant, fixed test sets).
Perplexity: masked-LM perplexity on the same fixed masks of the corpus's held-out split; the
base model's MLM head is fitted first ({spec.head_fit_steps} steps, encoder frozen), because the
base checkpoint ships none. `*`: another vocabulary or masking scheme gives other masked inputs,
so that number is not comparable with the others.

{chr(10).join(lines)}
{(chr(10) + "Recipes (compared with plain DAPT at the same budget, paired by seed):" + chr(10) + chr(10) + chr(10).join(notes) + chr(10)) if notes else ""}
![study]({name}.png)
{label_efficiency_section(summary)}
## Reading

{chr(10).join(verdict(summary))}

Per-seed values are in `{name}.json`; MLflow experiment `adaptbert-study`, parent run `{meta["run_name"]}`
(one child per pretraining and per variant and seed).
"""


def plot(summary: dict[str, Any], out: Path) -> None:
    """Left: perplexity against DAPT steps; right: each task's mean ± std against DAPT steps, per variant.
    With several label fractions, a second row: each task's mean ± std against the share of train labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    curve = [r for r in rows if r["variant"] == "base" or r["variant"].startswith("dapt@")]
    levels = summary.get("label_efficiency") or []
    n_rows, n_cols = 1 + bool(levels), 1 + len(summary["tasks"])
    fig, grid = plt.subplots(n_rows, n_cols, figsize=(5 * n_cols, 4 * n_rows), squeeze=False)
    axes = grid[0]
    axes[0].plot([r["dapt_steps"] for r in curve], [r["perplexity"] for r in curve], "o-")
    axes[0].set(xlabel="DAPT steps", ylabel="held-out MLM perplexity", title="perplexity")
    for ax, t in zip(axes[1:], summary["tasks"], strict=True):
        ax.errorbar(
            [r["dapt_steps"] for r in curve],
            [100 * r[t]["mean"] for r in curve],
            yerr=[100 * r[t]["std"] for r in curve],
            fmt="o-",
            capsize=4,
            label="base / dapt@N",
        )
        shift = 0.03 * max(r["dapt_steps"] for r in rows)  # side by side with the dapt point of the same budget
        for i, (r, marker) in enumerate(zip([r for r in rows if r not in curve], "s^DvPX*", strict=False)):
            ax.errorbar(
                [r["dapt_steps"] + (i + 1) * shift],
                [100 * r[t]["mean"]],
                yerr=[100 * r[t]["std"]],
                fmt=marker,
                capsize=4,
                label=r["variant"],
            )
        ax.axhline(100 * summary["trivial"][t], color="grey", ls=":", label="trivial")
        ax.set(xlabel="DAPT steps", ylabel=f"test {summary['primary'][t]} (points)", title=t)
        ax.legend(fontsize=8)
    if levels:
        plot_label_efficiency(summary, levels, grid[1])
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_label_efficiency(summary: dict[str, Any], levels: list[dict[str, Any]], axes: Any) -> None:
    """Per task: test score (mean ± std over seeds) against the share of train labels, one line per variant."""
    axes[0].axis("off")
    shares = [100 * level["fraction"] for level in levels]
    for ax, t in zip(axes[1:], summary["tasks"], strict=True):
        for i, variant in enumerate(r["variant"] for r in levels[0]["rows"]):
            rows = [next(r for r in level["rows"] if r["variant"] == variant) for level in levels]
            ax.errorbar(
                [x * (1 + 0.02 * i) for x in shares],  # a little apart, so error bars do not hide each other
                [100 * r[t]["mean"] for r in rows],
                yerr=[100 * r[t]["std"] for r in rows],
                fmt="o-",
                capsize=3,
                label=variant,
            )
        ax.axhline(100 * summary["trivial"][t], color="grey", ls=":", label="trivial")
        ax.set_xscale("log")
        ax.set_xticks(shares, [f"{x:g}%" for x in shares])
        ax.set(xlabel="train labels used", ylabel=f"test {summary['primary'][t]} (points)", title=f"{t}: labels")
        ax.legend(fontsize=8)


# ----------------------------------------------------------------------------- driver


def run_study(spec_path: Path, root: Path = ROOT, work: Path | None = None, out: Path | None = None) -> dict[str, Any]:
    """Run (or resume) the study of ``spec_path``; write ``<out>/<name>.{md,json,png}`` (default ``reports/study/``)."""
    import platform

    import mlflow

    from pipeline.core.io import write_json, write_text
    from pipeline.tracking.runs import connect

    name = spec_path.stem
    spec = load_spec(spec_path)
    cfg = study_config(spec, root)
    work = work or root / ".study" / name
    start = time.perf_counter()
    _, experiment_id = connect(cfg.tracking.model_copy(update={"experiment": "adaptbert-study"}), Paths(root))
    mlflow.set_experiment(experiment_id=experiment_id)  # the child runs go where the parent is
    run_name = f"dapt-study:{name}"
    with mlflow.start_run(run_name=run_name, experiment_id=experiment_id):
        mlflow.log_params(
            {
                "profile": spec.profile,
                "seeds": spec.seeds,
                "dapt_budgets": spec.dapt_budgets,
                "head_fit_steps": spec.head_fit_steps,
                "tapt_steps": spec.tapt_steps,
                "label_fractions": spec.label_fractions,
                "recipes": sorted(spec.recipes),
                **spec.overrides,
            }
        )
        data = prepare_data(spec, root, work)
        base, dapt = base_encoder(spec, root, data, work), dapt_encoders(spec, root, data, work)
        largest = dapt[-1]
        encoders = [base, *dapt]
        if spec.vocab_extension:
            encoders.append(vocab_encoder(spec, root, data, work))
        if spec.tapt_steps:
            tapt = tapt_data(spec, root, data, work)
            encoders += [tapt_encoder(spec, root, tapt, data, work, start) for start in (base, largest)]
        encoders += recipe_encoders(spec, root, data, work, largest)
        results = [
            finetune_logged(spec, root, data, work, enc, seed, fraction)
            for fraction in spec.label_fractions
            for enc in encoders
            for seed in spec.seeds
        ]
        summary = summarise_fractions(spec, results, encoders, trivial_scores(spec, root, data))
        meta = {
            "command": f"python -m studies.dapt_study {spec_path.relative_to(root) if spec_path.is_relative_to(root) else spec_path}",
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {_cores()} CPU cores, {_device()}",
            "minutes": (time.perf_counter() - start) / 60,
            "run_name": run_name,
        }
        out = out or root / "reports" / "study"
        out.mkdir(parents=True, exist_ok=True)
        plot(summary, out / f"{name}.png")
        write_text(out / f"{name}.md", to_markdown(name, spec, summary, meta))
        write_json(out / f"{name}.json", {"spec": spec.model_dump(), "summary": summary, "results": results})
        for row in summary["rows"]:
            mlflow.log_metric(f"mean_primary.{slug(row['variant'])}", row["mean"]["mean"])
        for suffix in (".md", ".json", ".png"):  # this study's files only, not every study's under reports/study/
            mlflow.log_artifact(str(out / f"{name}{suffix}"), artifact_path="study")
    return summary


def finetune_logged(
    spec: StudySpec, root: Path, data: Paths, work: Path, enc: Encoder, seed: int, fraction: float
) -> dict[str, Any]:
    """``finetune_and_test`` inside an MLflow child run (params, test metrics, perplexity); prints the scores."""
    import mlflow

    labels = "" if fraction == 1 else f" labels {fraction:.0%}"
    with mlflow.start_run(run_name=f"{enc.variant} seed {seed}{labels}", nested=True):
        mlflow.set_tags({"study.role": "finetune", "study.variant": enc.variant})
        mlflow.log_params(
            {
                "variant": enc.variant,
                "seed": seed,
                "label_fraction": fraction,
                "dapt_steps": enc.dapt_steps,
                "encoder": str(enc.encoder_dir),
                **{f"recipe.{k}": v for k, v in enc.finetune_overrides.items()},
            }
        )
        r = finetune_and_test(spec, root, data, work, enc, seed, fraction)
        mlflow.log_metrics({f"test_{t}_{r['test'][t]['primary']}": v["value"] for t, v in r["test"].items()})
        if enc.perplexity is not None:
            mlflow.log_metric("perplexity", enc.perplexity)
    print(
        f"study: {enc.variant} seed {seed}{labels}: "
        + ", ".join(f"{t} {v['value']:.4f}" for t, v in r["test"].items()),
        flush=True,
    )
    return r


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _device() -> str:
    """The GPU, or the CPU model with its bf16/AMX flags (what the study's speed and precision depend on)."""
    import torch

    from pipeline.modelling.precision import detect_hardware

    return torch.cuda.get_device_name() if torch.cuda.is_available() else f"no GPU, {detect_hardware().describe()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="studies/<name>.yaml")
    parser.add_argument("--workdir", type=Path, default=None, help="work files (default .study/<name>/)")
    args = parser.parse_args()
    try:
        run_study(args.spec.resolve(), ROOT, args.workdir)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
