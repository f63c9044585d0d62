"""evaluate stage: test metrics of the adapted and the baseline model, and the gain from adaptation.

For every task, both fine-tuned models (``models/finetuned/``, ``models/baseline/``) are scored
on the test split with the task type's metric (scikit-learn for classification, seqeval strict
IOB2 for NER, SQuAD EM/F1 for QA), next to the task's trivial baseline (majority class, all-O,
most frequent answer). The DAPT-vs-baseline delta on the primary metric gets a paired bootstrap
confidence interval over test examples. Held-out MLM perplexity of the base and adapted models
comes from the pretrain stage (same fixed masks). Writes ``reports/metrics.json`` (read by DVC,
MLflow, Prefect and the README), ``reports/evaluation.md``, PNG plots in ``reports/plots/``, the error
analysis ``reports/errors.json`` (:mod:`pipeline.tasks.errors`) and every test answer in
``reports/predictions/<task>.jsonl``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.console import Progress
from pipeline.core.io import read_report_if_any, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.evaluation import EvaluationReport, TaskEvaluation
from pipeline.core.reports.finetune import FinetuneReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.reporting.attention import attention_views
from pipeline.reporting.evaluation import evaluation_markdown, rounded, summarise, verdict, watch
from pipeline.reporting.figures import use_headless
from pipeline.reporting.headline import summary_headline, verdict_and_watch
from pipeline.reporting.headline import verdict as verdict_lines
from pipeline.reporting.numbers import points, points_interval
from pipeline.reporting.plots import (
    plot_attention_views,
    plot_confusions,
    plot_entity_f1,
    plot_learning_curves,
)


@dataclass
class Evaluated:
    """What scoring the test splits gives: per task the metrics (``results``), the plots' data (``extras``), the
    error analysis and every prediction; and the CI of the mean gain over tasks."""

    results: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Any] = field(default_factory=dict)
    predictions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    mean_delta: dict[str, float] | None = None


def evaluate_tasks(cfg: Config, paths: Paths, precision: Precision) -> Evaluated:
    """Per-task test metrics of every available model; the plots' data; the error analysis; every prediction."""
    from pipeline.tasks.errors import prediction_records, task_errors
    from pipeline.tasks.metrics import bootstrap_interval, bootstrap_mean_delta, paired_bootstrap, primary_metric
    from pipeline.training.data import load_contender
    from pipeline.training.multitask import score_task

    ec = cfg.evaluate
    baseline_dir = (
        paths.tokenized / "baseline" / "tasks" if (paths.tokenized / "baseline").exists() else paths.task_features
    )
    models = {"adapted": load_contender(paths.finetuned, cfg, paths, paths.task_features)}
    if (paths.baseline / "tasks.json").exists():
        models["baseline"] = load_contender(paths.baseline, cfg, paths, baseline_dir)
    out = Evaluated()
    results, extras = out.results, out.extras
    paired = []  # per task: both models' per-example statistics, for the CI of the mean gain
    progress = Progress("evaluate: scoring", len(models["adapted"][2]), "tasks")  # a line every 10 s on large tests
    for done, (name, data) in enumerate(models["adapted"][2].items(), start=1):
        spec, kind = data.spec, data.spec.kind
        scored = {
            m: score_task(model, tasks[name], "test", tok.pad_token_id, ec.batch_size, precision, with_confidence=True)
            for m, (model, tok, tasks) in models.items()
        }
        gold = scored["adapted"].gold
        trivial = kind.score(gold, kind.trivial(data.rows["train"], data.rows["test"], spec), spec)
        entry: dict[str, Any] = {
            "type": spec.type,
            "primary": spec.primary,
            "test_examples": len(gold),
            "trivial_baseline": kind.trivial_name,
            "trivial": trivial,
        }
        entry.update({m: s.metrics for m, s in scored.items()})
        metric, stats = primary_metric(kind, spec), {m: kind.stats(gold, s.pred, spec) for m, s in scored.items()}
        entry["primary_ci"] = {  # each model's own interval, from the same resamples as the gain's
            m: list(bootstrap_interval(st, metric, ec.bootstrap_resamples, cfg.seed, ec.confidence))
            for m, st in stats.items()
        }
        if "baseline" in scored:
            paired.append((stats["adapted"], stats["baseline"], metric))
            ci = paired_bootstrap(*paired[-1], ec.bootstrap_resamples, cfg.seed, ec.confidence)
            entry.update(delta=ci["delta"], ci_low=ci["low"], ci_high=ci["high"])
        results[name] = entry
        extras[name] = {"labels": spec.labels}
        if ec.attention_examples:
            extras[name]["attention"] = attention_views(models, name, ec)
        matrices = {m: kind.confusion(gold, s.pred, spec) for m, s in scored.items()}
        if all(m is not None for m in matrices.values()):
            extras[name]["confusion"] = matrices
        out.errors[name], mistakes = task_errors(
            kind, spec, data.rows["train"], data.rows["test"], scored, ec.error_examples
        )
        out.predictions[name] = prediction_records(kind, spec, data.rows["test"], scored, mistakes)
        progress.update(done, task=name)
    progress.close()
    if paired:
        out.mean_delta = bootstrap_mean_delta(paired, ec.bootstrap_resamples, cfg.seed, ec.confidence)
    return out


def run(cfg: Config, paths: Paths) -> EvaluationReport:
    """Score both models on every test split; write metrics.json, evaluation.md and the plots."""
    use_headless()
    start = time.perf_counter()
    precision = resolve_precision(cfg.precision)  # a config error before a missing input
    require_inputs(paths.finetuned, paths.baseline, paths.task_features, paths.tasks)
    ev = evaluate_tasks(cfg, paths, precision)
    pretrain_report = read_report_if_any(paths.pretrain_report, PretrainReport)
    finetune_report = read_report_if_any(paths.finetune_report, FinetuneReport)
    report = evaluation_report(cfg, paths, ev, pretrain_report, finetune_report, precision)
    with transaction(paths.root, "evaluate") as txn:
        out = txn.dir(paths.plots)
        plots = (
            plot_confusions(ev.extras, out)
            + plot_entity_f1(report.tasks, out)
            + plot_learning_curves(paths.finetune_curves, out)
            + plot_attention_views(ev.extras, cfg.evaluate, out)
        )
        written = txn.dir(paths.predictions)
        for name, records in ev.predictions.items():
            (written / f"{name}.jsonl").write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
            )
        errors = rounded(ev.errors)
        txn.write_json(paths.errors, errors)
        report = report.model_copy(update={"seconds": round(time.perf_counter() - start, 1)})
        said = verdict_lines(None, None, pretrain_report)  # the perplexity statement, as the run's headline has it
        txn.write_text(paths.evaluation, evaluation_markdown(report, plots, errors, said[-1] if said else None))
        txn.write_report(paths.metrics, report)
    return report


def evaluation_report(
    cfg: Config,
    paths: Paths,
    ev: Evaluated,
    pretrain: PretrainReport | None,
    finetune: FinetuneReport | None,
    precision: Precision,
) -> EvaluationReport:
    """metrics.json as its type: the scored tasks, their summary, verdict and red flags (from the unrounded
    numbers), then every number rounded to 5 places."""
    tasks = {name: TaskEvaluation.model_validate(entry) for name, entry in ev.results.items()}
    summary = summarise(tasks, pretrain, ev.mean_delta)
    body: dict[str, Any] = {
        "summary": summary.as_json(),
        "tasks": ev.results,
        "bootstrap": {"resamples": cfg.evaluate.bootstrap_resamples, "confidence": cfg.evaluate.confidence},
        "precision": {
            "pretrain": pretrain.precision if pretrain else None,
            "finetune": finetune.precision if finetune else None,
            "evaluate": precision.name,
        },
    }
    if (said := verdict(tasks, summary, pretrain, finetune)) is not None:
        body["verdict"] = said
    body["watch"] = watch(tasks, ev.extras)
    body["synthetic"] = synthetic_data(paths)
    if finetune and finetune.single_task is not None:
        body["single_task"] = {n: {"primary": v.primary, "test": v.test} for n, v in finetune.single_task.items()}
    return EvaluationReport.model_validate(rounded(body))


def synthetic_data(paths: Paths) -> bool:
    """Whether every task was read from the embedded synthetic demo domain (``data/demo/``): the reports and the
    model cards then say that its numbers show the pipeline working, not what adaptation buys on real text."""
    demo = paths.demo.resolve()
    files = [
        Path(f)
        for meta in sorted(paths.tasks.glob("*/task.json"))
        for f in json.loads(meta.read_text(encoding="utf-8"))["files"].values()
    ]
    return bool(files) and all((paths.root / f).resolve().is_relative_to(demo) for f in files)


def summary(r: EvaluationReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline evaluate`` (what ``run`` returned, read for a person)."""
    rows = []
    for name, t in r.tasks.items():
        p = t.primary
        base = t.score("baseline")
        shown_base = f"baseline {points(base)} -> " if base is not None else ""
        ci = (
            f" (delta {points(t.gain[0], signed=True)}, {r.bootstrap.confidence:.0%} CI {points_interval(*t.gain[1:])})"
            if t.gain
            else ""
        )
        rows.append(
            f"  {name} {p}: trivial {points(t.score('trivial'))}, {shown_base}adapted {points(t.score('adapted'))}{ci}"
        )
    mean = f"mean primary: {summary_headline(r.summary)}"
    said = ""
    if lines := verdict_and_watch(r):
        pre = read_report_if_any(paths.pretrain_report, PretrainReport)
        minutes = f"pretraining took {pre.train_seconds / 60:.1f} min this run" if pre and pre.train_seconds else ""
        said = "\nverdict:\n" + "\n".join(f"  {line}" for line in [*lines, minutes] if line)
    return (
        "test metrics (points)\n"
        + "\n".join(rows)
        + f"\n{mean}; report: {paths.evaluation}, metrics: {paths.metrics}{said}"
    )
