"""``reports/summary.json``: the run's headline, the one DVC metrics file (``dvc metrics show`` fits a terminal).

Flat, short keys, each a number that only changes when the model does (no timings), so that
``dvc metrics diff`` shows what a change bought:

- ``adapted`` / ``baseline`` / ``gain``: mean primary test metric of the adapted and un-adapted models, and
  their difference (0-1 scale);
- ``ppl``: held-out masked-LM perplexity of the adapted model;
- one entry per task: its primary test metric, adapted (``"ner": 1.0``; which metric is primary is in
  ``reports/metrics.json``), so the table stays narrow;
- ``served``: what the registry serves for this run (``full`` or a compressed variant); ``promoted``: whether it
  became the champion.
"""

from __future__ import annotations

import html
from typing import Any

from pipeline.core.base_model import HUB_IDS, NO_MLM_HEAD
from pipeline.core.reports.evaluation import EvaluationReport, EvaluationSummary
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.reports.promotion import PromotionReport
from pipeline.reporting.numbers import points, points_interval

HEADLINE_KEYS = ("adapted", "baseline", "gain", "ppl", "served", "promoted")  # the rest are tasks
SYNTHETIC = (
    "the data is adaptbert's synthetic demo domain (template sentences about invented drugs): these numbers show "
    "the pipeline working, not what adaptation buys on real text."
)


def headline(metrics: EvaluationReport, promotion: PromotionReport) -> dict[str, Any]:
    """The summary from evaluate's ``metrics.json`` and register's report (values rounded to 4 places)."""
    s = metrics.summary
    out: dict[str, Any] = {
        "adapted": round(s.mean_primary_adapted, 4),
        "baseline": round(s.mean_primary_baseline, 4) if s.mean_primary_baseline is not None else None,
        "gain": round(s.mean_primary_delta, 4) if s.mean_primary_delta is not None else None,
        "ppl": float(f"{s.perplexity_adapted:.4g}") if s.perplexity_adapted is not None else None,
    }
    for name, task in sorted(metrics.version_scores().tasks.items()):
        out[name] = round(task.score, 4)
    out["served"] = promotion.serving.choice
    out["promoted"] = promotion.promoted
    return out


def headline_text(adapted: Any, baseline: Any = None, gain: Any = None, low: Any = None, high: Any = None) -> str:
    """The run's headline as every place a person reads it says it (the run report, the MLflow parent run's note, the
    model card, ``adaptbert history``, the console): ``adapted 82.6, baseline 78.6, gain +4.0 [+1.7, +6.0]`` (mean
    primary test metric in points, :func:`pipeline.reporting.numbers.points`; the gain's paired bootstrap CI where
    there is one; the adapted score alone without a baseline)."""
    if baseline is None or gain is None:
        return f"adapted {points(adapted)}"
    ci = f" {points_interval(low, high)}" if low is not None and high is not None else ""
    return f"adapted {points(adapted)}, baseline {points(baseline)}, gain {points(gain, signed=True)}{ci}"


def summary_headline(summary: EvaluationSummary) -> str:
    """:func:`headline_text` of evaluate's summary (``metrics.json``'s ``summary``)."""
    return headline_text(
        summary.mean_primary_adapted,
        summary.mean_primary_baseline,
        summary.mean_primary_delta,
        summary.mean_primary_delta_low,
        summary.mean_primary_delta_high,
    )


def execution_headline(row: dict[str, Any]) -> str:
    """A pipeline execution's headline (a row of ``adaptbert history``) as its run report and note say it."""
    if row["adapted"] is None:
        return "-"
    return headline_text(row["adapted"], row["baseline"], row["gain"], row["gain_low"], row["gain_high"])


def md_text(line: str) -> str:
    """A line of prose that may quote the data (a label, a task name) for a Markdown page: its ``<``, ``>`` and ``&``
    as entities, so a label such as ``<img src=x onerror=...>`` is text, not markup, wherever Markdown renders HTML
    (MLflow's note, Prefect's artifacts, a model card on the Hub)."""
    return html.escape(line, quote=False)


def verdict_and_watch(metrics: EvaluationReport) -> list[str]:
    """evaluate's verdict lines, then its watch lines (``Watch: ...``)."""
    flags = [*metrics.watch, *([SYNTHETIC] if metrics.synthetic else [])]
    return [*(metrics.verdict or []), *(f"Watch: {flag}" for flag in flags)]


def verdict(
    metrics: EvaluationReport | None, promotion: PromotionReport | None, pretrain: PretrainReport | None
) -> list[str]:
    """The run's verdict in a few sentences (markdown): what adaptation bought with its CIs and on how many tasks
    the CI is above 0, the comparison with the champion and why it was or was not promoted, and a perplexity
    statement that does not compare with an untrained head."""
    lines = verdict_and_watch(metrics) if metrics else []  # evaluate's: the gain, the tasks, the red flags
    if promotion:
        before = promotion.champion_before
        new, old = promotion.mean_primary_challenger, promotion.mean_primary_champion
        outcome = "promoted to champion" if promotion.promoted else "not promoted"
        why, version = gate_reason(promotion.reason), promotion.version
        if before and new is not None and old is not None:
            lines.append(
                f"Against the champion v{before}: {points((new - old), signed=True)} points of mean primary "
                f"({points(new)} vs {points(old)}); v{version} {outcome}: {why}."
            )
        else:
            lines.append(f"No champion before: v{version} {outcome} ({why}).")
    if pretrain:
        ppl, base = pretrain.adapted_perplexity, pretrain.base_perplexity
        what = perplexity_name(pretrain)
        if pretrain.base_model in NO_MLM_HEAD:
            lines.append(
                f"Held-out {what} of the adapted model: {ppl:.3g}. The base model "
                f"({HUB_IDS.get(pretrain.base_model, pretrain.base_model)}) ships no MLM head, so its {base:,.0f} is that of a "
                "freshly initialised head: no measure of what adaptation bought."
            )
        else:
            lines.append(f"Held-out {what}: base model {base:,.3g} -> adapted {ppl:.3g}.")
    return lines


def gate_reason(reason: str) -> str:
    """The gate's reason without the outcome and the "no champion yet" the line around it already says
    (``promoted: no champion yet and every task clears its floor`` -> ``every task clears its floor``)."""
    for said in ("not promoted: ", "promoted: ", "no champion yet, and ", "no champion yet and "):
        reason = reason.removeprefix(said)
    return reason.rstrip(".")


def perplexity_name(pretrain: PretrainReport) -> str:
    """What reports/pretrain.json's held-out perplexity measures: the masked LM's, or ELECTRA's generator's (the
    encoder itself, ELECTRA's discriminator, predicts no tokens)."""
    if pretrain.electra is not None:
        return f"perplexity of the {pretrain.electra.generator_layers}-layer ELECTRA generator"
    return "masked-LM perplexity"


def headline_markdown(
    summary: dict[str, Any], verdict_lines: list[str] | None = None, scored: EvaluationSummary | None = None
) -> str:
    """The summary as a few lines of markdown (the pipeline run's note in MLflow), the verdict first; ``scored``:
    evaluate's summary (metrics.json), whose digits and CI the headline reads as the run report does (summary.json
    keeps four places and no CI)."""

    def pct(value: Any) -> str:
        return "-" if value is None else f"{points(value)}"

    shown = (
        summary_headline(scored)
        if scored
        else headline_text(summary["adapted"], summary.get("baseline"), summary.get("gain"))
    )
    lines = [
        *(f"{md_text(line)}\n" for line in verdict_lines or []),
        f"**Mean primary test metric** (points): {shown}",
        "",
        "| task | adapted (primary metric) |",
        "|---|---|",
    ]
    for name, value in summary.items():
        if name not in HEADLINE_KEYS:
            lines.append(f"| {name} | {pct(value)} |")
    ppl = summary.get("ppl")
    lines += [
        "",
        f"Held-out perplexity of the adapted model: {ppl:.3f}." if ppl is not None and not verdict_lines else "",
        f"Served: **{summary['served']}**; "
        + ("promoted to champion." if summary["promoted"] else "not promoted (the champion stays)."),
        "",
        "The run report: `reports/index.html` (artifact `report/index.html`).",
    ]
    return "\n".join(lines) + "\n"
