"""finetune stage: multi-task fine-tuning of the adapted encoder, and of the un-adapted baseline.

One shared encoder (``models/dapt/``) with one head per declared task, trained by
:func:`pipeline.training.trainer.train` (the HF Trainer on single-task batches: task sampling,
per-task loss weights, layer-wise LR decay, warmup then decay, gradient clipping, dev evaluation
every ``eval_steps`` with early stopping on the mean of the tasks' primary dev metrics, and the
best checkpoint restored at the end). With ``finetune.baseline`` the un-adapted base model (its own
vocabulary, same recipe, seed and step budget) is trained the same way: evaluate compares the
two. Outputs replace ``models/finetuned/`` and ``models/baseline/`` only when every run succeeded.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.io import read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.finetune import FinetuneReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.reporting.model_readmes import multitask_card
from pipeline.training.checkpoints import copy_curves
from pipeline.training.contenders import (
    Contender,
    adapted_contender,
    baseline_contender,
    finetune_place,
    train_contender,
)
from pipeline.training.data import load_tasks
from pipeline.training.search import chosen_config
from pipeline.training.side_by_side import side_by_side_threads, torch_threads, train_side_by_side


def single_task_scores(cfg: Config, paths: Paths, tasks: dict[str, Any], precision: Precision) -> dict[str, Any]:
    """One model per task (adapted encoder, same recipe and budget): its test metrics, for comparison."""
    from pipeline.training.multitask import score_task

    out = {}
    cfg, _ = chosen_config(cfg, paths, "adapted")  # the adapted model's settings (searched on the multi-task dev)
    for name, data in tasks.items():
        contender = adapted_contender(paths)
        contender.name = f"single-{name}"
        model, summary = train_contender(cfg, paths, contender, {name: data}, precision)
        scored = score_task(
            model, data, "test", contender.tokenizer.pad_token_id, cfg.finetune.eval_batch_size, precision
        )
        out[name] = {**summary, "test": scored.metrics, "primary": data.spec.primary}
    return out


def same_compute_steps(paths: Paths, adapted: dict[str, Any]) -> dict[str, Any]:
    """The baseline's extra fine-tuning steps under ``baseline_budget: same_compute``: the pretraining's training
    seconds (reports/pretrain.json, with its measured half) x the adapted run's steps per second."""
    seconds, steps_per_s = read_report(paths.pretrain_report, PretrainReport).train_seconds, None
    if adapted.get("train_seconds") and adapted.get("steps"):
        steps_per_s = adapted["steps"] / adapted["train_seconds"]
    if seconds is None or not steps_per_s:  # 0 seconds is an answer: the adaptation chosen was none
        raise DataError(
            paths.pretrain_report,
            None,
            "missing-input",
            "finetune.baseline_budget: same_compute needs the pretraining time (train_seconds in reports/measured/"
            "pretrain.json) and the adapted run's speed; run dvc repro pretrain again, or use same_steps",
        )
    return {
        "pretrain_seconds": seconds,
        "adapted_steps_per_s": round(steps_per_s, 3),
        "extra_steps": round(seconds * steps_per_s),
    }


def train_all(
    cfg: Config,
    paths: Paths,
    contenders: list[Contender],
    precision: Precision,
    threads: int | None,
    budget: dict[str, Any],
    searched: dict[str, Any],
) -> list[tuple[Contender, dict[str, Any], Any, dict[str, Any]]]:
    """Train every contender, side by side with ``threads`` each or one after the other (``None``); fills ``budget``
    (same-compute steps) and ``searched`` (the search's choices) as it goes."""
    fc = cfg.finetune
    chosen = {c.name: chosen_config(cfg, paths, c.name) for c in contenders}  # params.yaml, or the search's choice
    configs = {name: own_cfg for name, (own_cfg, _) in chosen.items()}
    side_by_side = train_side_by_side(configs, paths, precision, threads) if threads else {}
    trained: list[tuple[Contender, dict[str, Any], Any, dict[str, Any]]] = []
    for contender in contenders:
        own_cfg, values = chosen[contender.name]
        if values:
            searched[contender.name] = values
        tasks = load_tasks(own_cfg, paths, contender.tokenized)
        if contender.name in side_by_side:
            model, summary = side_by_side[contender.name]
        else:
            extra = 0
            if contender.name == "baseline" and fc.baseline_budget == "same_compute":
                budget.update(same_compute_steps(paths, trained[0][3]))
                extra = budget["extra_steps"]
            model, summary = train_contender(own_cfg, paths, contender, tasks, precision, extra)
        trained.append((contender, tasks, model, summary))
    return trained


def run(cfg: Config, paths: Paths) -> FinetuneReport:
    """Fine-tune the adapted model (and the baseline); write the models and ``reports/finetune.json``."""
    from pipeline.training.multitask import save_multitask

    fc = cfg.finetune
    precision = resolve_precision(cfg.precision)  # before any work: bf16 asked on hardware without it stops here
    require_inputs(paths.dapt, paths.task_features, paths.tasks)
    contenders = [adapted_contender(paths)] + ([baseline_contender(cfg, paths)] if fc.baseline else [])
    budget: dict[str, Any] = {"mode": fc.baseline_budget}
    searched: dict[str, Any] = {}
    threads = side_by_side_threads(
        fc.side_by_side, precision.device, len(contenders), fc.baseline_budget == "same_compute", torch_threads()
    )
    trained = train_all(cfg, paths, contenders, precision, threads, budget, searched)
    fields: dict[str, Any] = {name: summary for (c, _, _, summary) in trained for name in [c.name]}
    if searched:  # (absent with search off: the report stays as it was)
        fields["search"] = searched
    if fc.baseline and fc.baseline_budget == "same_compute":  # (absent by default: the report stays as it was)
        fields["baseline_budget"] = budget
    fields.update(precision.as_report())
    if threads:  # (absent when the models trained one after the other: the report stays as it was)
        fields["side_by_side"] = {"processes": len(contenders), "threads_each": threads}
    fields["tasks"] = {
        n: {
            "type": d.spec.type,
            "primary": d.spec.primary,
            "labels": d.spec.labels,
            "train_features": len(d.splits["train"]),
        }
        for n, d in trained[0][1].items()
    }
    if fc.single_task:
        fields["single_task"] = single_task_scores(cfg, paths, trained[0][1], precision)
    report = FinetuneReport.model_validate(fields)  # only the keys set above are written
    with transaction(paths.root, "finetune") as txn:
        out_adapted, out_baseline = txn.dir(paths.finetuned), txn.dir(paths.baseline)
        for (contender, tasks, model, summary), out in zip(trained, (out_adapted, out_baseline), strict=False):
            rows = [(n, d.spec.type, len(d.spec.labels), d.spec.primary) for n, d in tasks.items()]
            card = multitask_card(contender.name, contender.source, summary, rows)
            save_multitask(model, contender.tokenizer, out, card)
        if not fc.baseline:
            (out_baseline / "README.md").write_text(
                "finetune.baseline is false: no baseline model was trained.\n", encoding="utf-8"
            )
        txn.write_report(paths.finetune_report, report)
        curves = txn.dir(paths.finetune_curves)
        for contender, *_ in trained:
            copy_curves(finetune_place(paths, contender).curves, curves / contender.name)
    return report


def summary(r: FinetuneReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline finetune`` (what ``run`` returned, read for a person)."""
    lines = []
    for name in ("adapted", "baseline"):
        if (m := r.model(name)) is not None:
            stop = "stopped early" if m.stopped_early else "ran to max_steps"
            speed = (
                f"{m.train_examples_per_s} examples/s"
                if m.train_examples_per_s
                else f"resumed finished run {m.resumed_from}"
            )
            lines.append(
                f"{name}: {m.steps} steps ({stop}), best dev mean primary {m.best_dev_mean_primary} at step {m.best_step}, "
                f"{speed}"
            )
    if (sbs := r.side_by_side) is not None:
        lines.append(f"trained side by side: {sbs.processes} processes of {sbs.threads_each} thread(s) each")
    return (
        "\n".join(lines)
        + f"\n{r.precision_reason}\nmodels: {paths.finetuned}, {paths.baseline}; report: {paths.finetune_report}"
    )
