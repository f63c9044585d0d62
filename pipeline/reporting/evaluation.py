"""The evaluation report: the summary of metrics.json, its verdict and watch lines, and evaluation.md.

Built from the scored tasks and the pretrain and finetune reports: no model is loaded here.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from pipeline.core.reports.evaluation import (
    EvaluationReport,
    EvaluationSummary,
    Model,
    TaskEvaluation,
)
from pipeline.core.reports.finetune import FinetuneReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.reporting.headline import md_text, verdict_and_watch
from pipeline.reporting.numbers import points, points_interval
from pipeline.reporting.plots import breakdown_of
from pipeline.reporting.tables import cell, dapt_view, to_markdown


def summarise(
    tasks: dict[str, TaskEvaluation], pretrain_report: PretrainReport | None, mean_delta: dict[str, float] | None = None
) -> EvaluationSummary:
    """Mean primary metrics, the mean delta (with its bootstrap CI, ``mean_delta``), how many tasks improved, and
    the MLM perplexities."""
    summary: dict[str, Any] = {}
    for model in MODELS:
        values = [v for t in tasks.values() if (v := t.score(model)) is not None]
        if values:
            summary[f"mean_primary_{model}"] = float(np.mean(values))
    if "mean_primary_baseline" in summary:
        summary["mean_primary_delta"] = summary["mean_primary_adapted"] - summary["mean_primary_baseline"]
        if mean_delta is not None and not math.isnan(mean_delta["low"]):
            summary["mean_primary_delta_low"], summary["mean_primary_delta_high"] = (
                mean_delta["low"],
                mean_delta["high"],
            )
        summary["tasks_improved"] = sum((t.delta or 0) > 0 for t in tasks.values())
        summary["tasks_improved_significantly"] = sum((t.ci_low or 0) > 0 for t in tasks.values())
    summary["perplexity_base"] = pretrain_report.base_perplexity if pretrain_report else None
    summary["perplexity_adapted"] = pretrain_report.adapted_perplexity if pretrain_report else None
    return EvaluationSummary.model_validate(summary)


CEILING = 0.995  # a primary metric at or above this (on a 0-1 scale) leaves its test set no room to show a gain
FLOOR_MARGIN = 0.01  # an adapted score within this of the trivial baseline's has learnt next to nothing
MODELS: tuple[Model, ...] = ("adapted", "baseline", "trivial")


def verdict(
    tasks: dict[str, TaskEvaluation],
    summary: EvaluationSummary,
    pre: PretrainReport | None,
    fine: FinetuneReport | None,
) -> list[str] | None:
    """Adapted vs baseline in two short lines: the gain with its interval and what each model was given; then which
    tasks' paired CIs clear 0 and which are within noise (losses with the CI below 0 are :func:`watch` lines).

    Steps and tokens, not minutes: these lines are versioned (metrics.json, evaluation.md); the console adds the
    minutes measured in this run."""
    if summary.mean_primary_delta is None or summary.mean_primary_baseline is None or not pre:
        return None
    what = pre.text_trained
    interval = " " + points_interval(*summary.gain_interval) if summary.gain_interval else ""
    spent = f"{pre.global_step} pretraining steps ({pre.tokens_seen:,} tokens)"
    budget = fine.baseline_budget if fine else None
    base = points(summary.mean_primary_baseline)
    if budget is not None:
        given = f"the baseline, given that time as {budget.extra_steps} more fine-tuning steps, reached {base}"
    elif fine and fine.search and fine.baseline:  # settings chosen on dev per model: the budgets may differ
        given = (
            f"the baseline reached {base} with settings chosen on its own dev split ({fine.baseline.steps} "
            f"steps; the adapted model {fine.adapted.steps}), without that time"
        )
    else:
        given = (
            f"the baseline reached {base} with the same fine-tuning steps, without that time "
            "(finetune.baseline_budget: same_compute gives it the time)"
        )
    gain = f"{what} bought {points(summary.mean_primary_delta, signed=True)}{interval} points of mean primary for {spent}; {given}."

    def shown(names: list[str]) -> str:
        return ", ".join(f"{n} {signed_interval(tasks[n])}" for n in names) or "none"

    gains = {n: g for n, t in tasks.items() if (g := t.gain) is not None}
    clear = [n for n, (_, low, _) in gains.items() if low > 0]
    noise = [n for n, (_, low, high) in gains.items() if low <= 0 <= high]
    said = f"The whole CI above 0 on {len(clear)} of {len(tasks)} task(s): {shown(clear)}"
    return [gain, said + (f"; within noise: {shown(noise)}." if noise else ".")]


def signed_interval(t: TaskEvaluation) -> str:
    """``+9.8 [+6.7, +13.0]``: a task's gain with its paired CI, in points."""
    delta, low, high = t.gain or (math.nan, math.nan, math.nan)
    return f"{points(delta, signed=True)} {points_interval(low, high)}"


def watch(tasks: dict[str, TaskEvaluation], extras: dict[str, Any]) -> list[str]:
    """Red flags in the adapted model's test predictions, one sentence each: a class it never predicts, a metric at
    its ceiling or no better than the trivial baseline, a task adaptation lost with the whole CI below 0."""
    flags: list[str] = []
    for name, t in tasks.items():
        metric, adapted, trivial = t.primary, t.score("adapted"), t.score("trivial")
        flags += [
            f"{name}: the adapted model never predicts {what}." for what in never_predicted(t, extras.get(name, {}))
        ]
        if adapted is None or trivial is None:
            continue
        if adapted >= CEILING:
            base = t.score("baseline")
            shown = f" (baseline {points(base)})" if base is not None else ""
            flags.append(
                f"{name}: {metric} {points(adapted)}{shown} is at the ceiling: this test set cannot show a gain."
            )
        elif adapted <= trivial + FLOOR_MARGIN:
            flags.append(
                f"{name}: {metric} {points(adapted)} is no better than the trivial baseline "
                f"({t.trivial_baseline}: {points(trivial)})."
            )
        if t.ci_high is not None and t.ci_high < 0:
            flags.append(f"{name}: adaptation lost {signed_interval(t)} points, the whole CI below 0.")
    return flags


def never_predicted(task: TaskEvaluation, extra: dict[str, Any]) -> list[str]:
    """``contradiction (69 test examples)`` for each class (or entity type) the test split has and the adapted model
    never predicts (never finds, for entities)."""
    matrix = extra.get("confusion", {}).get("adapted")
    if matrix:  # rows: gold, columns: predicted
        labels = extra.get("labels") or []
        gold = [sum(row) for row in matrix]
        predicted = [sum(col) for col in zip(*matrix, strict=True)]
        return [f"{labels[i]} ({gold[i]} test examples)" for i in range(len(matrix)) if gold[i] and not predicted[i]]
    per_type = task.breakdown("adapted", "per_type")
    return [
        f"a {kind} entity ({t['support']} in the test split)"
        for kind, t in per_type.items()
        if t.get("support") and t["recall"] == 0
    ]


def rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


def model_interval(task: TaskEvaluation, model: str) -> str:
    """`` [low, high]`` in percent: ``model``'s own CI of the task's primary metric, or nothing where there is none."""
    ci = task.interval(model)
    return f" [{pct(ci[0])}, {pct(ci[1])}]" if ci else ""


def pct(x: float | None) -> str:
    return cell(x, "pct")


def evaluation_markdown(
    report: EvaluationReport,
    plots: list[str],
    errors: dict[str, Any] | None = None,
    perplexity: str | None = None,
) -> str:
    """The human report: the DAPT-vs-baseline table, every metric, the perplexity statement (``perplexity``:
    :func:`pipeline.reporting.headline.verdict`'s, which never compares with an untrained head), the error
    analysis and the plots."""
    s, tasks, boot = report.summary, report.tasks, report.bootstrap
    lines = [
        "# Evaluation: domain-adapted vs un-adapted",
        "",
        "All metrics on the test splits, in percent. Delta = adapted - baseline on the task's primary metric; "
        f"the interval is a paired bootstrap {boot.confidence:.0%} CI over test examples ({boot.resamples} resamples).",
        "",
    ]
    if report.has_baseline:
        lines += [
            to_markdown(dapt_view(report)),
            "",
            f"Tasks improved: {s.tasks_improved} of {len(tasks)} ({s.tasks_improved_significantly} with the whole CI above 0).",
            "",
        ]
        if said := verdict_and_watch(report):
            lines += ["**Verdict.**", "", *(f"- {md_text(line)}" for line in said), ""]
    lines += all_metrics_markdown(report) + breakdowns_markdown(tasks)
    if perplexity:
        lines += [
            "",
            "## Held-out domain perplexity",
            "",
            f"{perplexity} Measured by the pretrain stage on the validation corpus, the same masked positions for "
            "both models.",
        ]
    if report.single_task:
        lines += [
            "",
            "## Multi-task vs single-task (adapted encoder, same budget)",
            "",
            "| task | primary | single-task | multi-task |",
            "|---|---|---|---|",
        ]
        for name, st in report.single_task.items():
            p = st.primary
            lines.append(f"| {name} | {p} | {pct(st.score)} | {pct(tasks[name].score('adapted'))} |")
    precisions = report.precision.model_dump()
    lines += [
        "",
        "Precision: "
        + ", ".join(f"{stage} {p}" for stage, p in precisions.items() if p)
        + " (`precision` in params.yaml; bf16 is autocast over fp32 weights, except that pretraining on a CPU"
        " trains bf16 weights with fp32 masters; losses are fp32).",
    ]
    if errors:
        lines += error_markdown(errors)
    lines += ["", "## Plots", ""] + [f"![{p}](plots/{p})" for p in plots]
    return "\n".join(lines) + "\n"


def all_metrics_markdown(report: EvaluationReport) -> list[str]:
    """Every scalar metric of every model, the primary one with the model's own interval."""
    lines = [
        "## All metrics",
        "",
        f"The primary metric with the model's own {report.bootstrap.confidence:.0%} interval (a bootstrap over the "
        "same test examples).",
        "",
        "| task | model | metrics |",
        "|---|---|---|",
    ]
    for name, t in report.tasks.items():
        for model in MODELS:
            if (scores := t.scores(model)) is not None:
                shown = ", ".join(
                    f"{k} {pct(v)}{model_interval(t, model) if k == t.primary else ''}"
                    for k, v in scores.items()
                    if isinstance(v, float)
                )
                lines.append(f"| {name} | {model} | {shown} |")
    return lines


def breakdowns_markdown(tasks: dict[str, TaskEvaluation]) -> list[str]:
    """Per task with a breakdown, F1 per entity type (NER) or per label (multi-label), baseline beside adapted."""
    lines: list[str] = []
    for name, t in tasks.items():
        key = breakdown_of(t)
        if key is None:
            continue
        title = "entities by type (seqeval, strict IOB2)" if key == "per_type" else "F1 by label"
        lines += [
            "",
            f"### {name}: {title}",
            "",
            f"| {'type' if key == 'per_type' else 'label'} | support | baseline F1 | adapted F1 |",
            "|---|---|---|---|",
        ]
        base = t.breakdown("baseline", key)
        for label, v in t.breakdown("adapted", key).items():
            lines.append(f"| {label} | {v['support']} | {pct(base.get(label, {}).get('f1'))} | {pct(v['f1'])} |")
    return lines


def md_cell(value: Any) -> str:
    """Text from the data as one Markdown table cell: no markup (HTML escaped), no ``|`` or line break."""
    return html.escape(str(value)).replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def confidence_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def errors_heading(name: str, e: dict[str, Any]) -> str:
    """``### ner: adapted wrong on 12 of 240 test examples; adaptation fixed 20 and broke 3``."""
    a = e["adapted"]
    said = (
        f"adapted wrong on {a['wrong']} of {e['examples']} test examples"
        if a["wrong"] is not None
        else "the answers furthest off"
    )
    if "changed" in e:
        said += f"; adaptation fixed {e['changed']['fixed']} and broke {e['changed']['broken']}"
    return f"### {name}: {said}"


def seen_unseen_line(e: dict[str, Any]) -> list[str]:
    """Mention F1 seen vs unseen in train, per model (token classification)."""
    parts = []
    for model in ("baseline", "adapted"):
        split = e.get(model, {}).get("seen_unseen")
        if split:
            parts.append(
                f"{model}: seen {pct(split['seen']['f1'])} ({split['seen']['gold']} mentions), "
                f"unseen {pct(split['unseen']['f1'])} ({split['unseen']['gold']})"
            )
    return [f"Entity F1 on mentions seen in train vs unseen: {'; '.join(parts)}.", ""] if parts else []


def error_markdown(errors: dict[str, Any]) -> list[str]:
    """The error analysis section of evaluation.md (the adapted model's errors; errors.json has both models')."""
    lines = [
        "",
        "## Error analysis (adapted model)",
        "",
        "Per task its most frequent confusions (gold -> predicted; for NER `O` is no entity) and the mistakes it "
        "was most sure of. Every test answer of both models: `reports/predictions/<task>.jsonl`; both models' "
        "analysis: `reports/errors.json`.",
    ]
    for name, e in errors.items():
        a = e["adapted"]
        lines += ["", errors_heading(name, e), ""] + seen_unseen_line(e)
        if a["confusions"]:
            lines += ["| gold | predicted | count |", "|---|---|---:|"]
            lines += [f"| {md_cell(c['gold'])} | {md_cell(c['pred'])} | {c['count']} |" for c in a["confusions"]]
            lines.append("")
        if a["mistakes"]:
            lines += ["| input | gold | predicted | confidence |", "|---|---|---|---:|"]
            lines += [
                f"| {md_cell(m['text'])} | {md_cell(m['gold'])} | {md_cell(m['pred'])} | "
                f"{confidence_text(m['confidence'])} |"
                for m in a["mistakes"]
            ]
    return lines
