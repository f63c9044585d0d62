"""The Prefect views of the stage reports: a report in, table rows or markdown out (no Prefect here).

Which stage publishes which view, under which key, is its record in :mod:`pipeline.core.stages`;
:mod:`flows.pipeline` publishes them. A renderer returns ``None`` when its report has nothing to show.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.core.mlflow_ui import mlflow_ui_page, ui_base
from pipeline.core.reports.adapt import AdaptReport
from pipeline.core.reports.compression import CompressionReport
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.ingest import IngestReport
from pipeline.core.reports.promotion import PromotionReport
from pipeline.core.reports.tokenize import TokenizeReport
from pipeline.core.sections.adapt import ARM_NAMES
from pipeline.reporting.headline import md_text, verdict
from pipeline.reporting.tables import adaptation_view, dapt_view, front_view, to_markdown, to_records


def validation_markdown(report: dict[str, Any]) -> str:
    """The validation summary: failed expectations first (with offending records), then the passed count."""
    failed = [(s["suite"], e) for s in report["suites"] for e in s["expectations"] if not e["success"]]
    head = (
        f"# Validation: {'passed' if report['success'] else 'FAILED'}\n\n{report['expectations'] - report['failed_expectations']} "
        f"of {report['expectations']} expectations passed in {len(report['suites'])} suites.\n"
    )
    if not failed:
        return head
    lines = [
        head,
        "## Failed expectations\n",
        "| suite | rule | expectation | observed | offending records |",
        "|---|---|---|---|---|",
    ]
    for suite, e in failed:
        offending = "<br>".join(
            f"`{o['file']}{'' if o['line'] is None else ':' + str(o['line'])}` "
            f"{json.dumps(o['values'], ensure_ascii=False)[:120]}"
            for o in e.get("offending", [])[:5]
        )
        observed = json.dumps(e.get("observed", {}), ensure_ascii=False)[:200]
        lines.append(f"| {suite} | {e['rule']} | `{e['expectation']}` | {observed} | {offending} |")
    return "\n".join(lines) + "\n"


def ingest_table(report: IngestReport) -> list[dict[str, Any]]:
    """Documents and examples read, kept and dropped: the corpus, then each task per split."""
    c = report.corpus
    rows: list[dict[str, Any]] = [
        {
            "dataset": "corpus",
            "read": c.documents_read,
            "kept": c.documents_kept,
            "train": c.train_documents,
            "validation": c.validation_documents,
            "test": "",
            "dropped": json.dumps(c.dropped),
        }
    ]
    for name, t in report.tasks.items():
        sp = t.splits
        rows.append(
            {
                "dataset": f"task {name} ({t.type})",
                "read": sum(s.examples + s.skipped for s in sp.values()),
                "kept": sum(s.examples for s in sp.values()),
                "train": sp["train"].examples,
                "validation": sp["validation"].examples,
                "test": sp["test"].examples,
                "dropped": json.dumps({k: s.skipped for k, s in sp.items() if s.skipped}),
            }
        )
    return rows


def tokenize_table(report: TokenizeReport) -> list[dict[str, Any]]:
    """The tokenize stage in one row: the vocabulary, what was packed, fragmentation, the packing speed."""
    f = report.fragmentation
    return [
        {
            "mode": report.mode,
            "vocab": report.vocab_size,
            "new_tokens": report.new_tokens,
            "tokens": report.tokens,
            "blocks": report.blocks,
            "unk_share": report.unk_share,
            "pieces_per_word": f"{f.pieces_per_word_base} -> {f.pieces_per_word_final}",
            "tokens_per_s": report.pack_tokens_per_s,
        }
    ]


def compression_table(report: CompressionReport) -> list[dict[str, Any]] | None:
    """The accuracy/latency front (reports/compression.json), the full model first; ``None`` when compression is off."""
    return to_records(front_view(report)) if report.enabled else None


def metrics_table(metrics: EvaluationReport) -> list[dict[str, Any]]:
    """Every scalar test metric of the adapted model (and the baseline), a row per task and metric."""
    rows = []
    for task, t in metrics.tasks.items():
        baseline, trivial = t.baseline or {}, t.trivial
        for name, value in t.adapted.items():
            if isinstance(value, int | float):
                rows.append(
                    {
                        "task": task,
                        "metric": name,
                        "primary": name == t.primary,
                        "adapted": value,
                        "baseline": baseline.get(name),
                        "trivial": trivial.get(name),
                    }
                )
    return rows


def dapt_table(metrics: EvaluationReport) -> list[dict[str, Any]]:
    """The DAPT-vs-baseline table: primary metric, delta and its bootstrap CI per task, then the means."""
    return to_records(dapt_view(metrics))


def mlflow_links(tracking_uri: str, run_id: str, model: str, version: str) -> tuple[str, str]:
    """UI addresses of a run and a model version (a local sqlite store: as shown by ``mlflow server`` on :5000)."""
    base = ui_base(tracking_uri)
    return mlflow_ui_page(f"runs/{run_id}", base), mlflow_ui_page(f"models/{model}/versions/{version}", base)


def verdict_markdown(metrics: EvaluationReport) -> str | None:
    """What adaptation bought, with its CIs and on how many tasks they clear 0 (evaluate's verdict)."""
    lines = [md_text(line) for line in verdict(metrics, None, None)]
    return "# Verdict\n\n" + "\n\n".join(lines) + "\n" if lines else None


def promotion_markdown(report: PromotionReport) -> str:
    """The register stage's Prefect artifact: the verdict, where champion went, the serving rule, links, the gate."""
    run_url, version_url = mlflow_links(report.tracking_uri, report.run_id, report.model_name, report.version)
    outcome = "**promoted**" if report.promoted else "**not promoted**"
    lines = [
        f"# {report.model_name} v{report.version}: {outcome}\n",
        *(f"{md_text(line)}\n" for line in verdict(None, report, None)),
        f"champion: v{report.champion_before or '-'} -> v{report.champion_after or '-'}\n",
        f"serving rule: challenger is {report.serving.choice} ({report.serving.reason})\n",
        f"- MLflow run: [{report.run_id}]({run_url})",
        f"- model version: [{report.model_name} v{report.version}]({version_url})",
        "",
        "| metric | challenger | champion | delta | rule | ok |",
        "|---|---:|---:|---:|---|---|",
    ]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.4f}"

    for r in report.table:
        lines.append(
            f"| {r.metric} | {fmt(r.challenger)} | {fmt(r.champion)} | {fmt(r.delta)} | {r.check} | "
            f"{'yes' if r.ok else 'NO'} |"
        )
    if not report.tracking_uri.startswith("http"):
        lines.append(
            f"\nThe store is `{report.tracking_uri}`: the links work with `mlflow server --backend-store-uri "
            f"{report.tracking_uri} --port 5000`."
        )
    return "\n".join(lines) + "\n"


def manual_promotion_markdown(
    name: str, version: str, promoted: bool, reason: str, before: str | None, after: str | None, forced: bool
) -> str:
    """The Prefect artifact of a promotion by hand (``adaptbert-promote``): the outcome, the gate's reason, where
    ``champion`` went."""
    return (
        f"# {name} v{version}: {'promoted' if promoted else 'not promoted'}\n\n{md_text(reason)}\n\n"
        f"champion: v{before or '-'} -> v{after or '-'}{' (forced)' if forced else ''}\n"
    )


def adaptation_markdown(report: AdaptReport) -> str | None:
    """The adapt stage's tournament: every arm's dev score and minutes per rung, the choice and its reason (``None``
    under ``adapt.strategy: fixed``)."""
    if not report.played or report.chosen is None:
        return None
    stopped = f"\n\n{report.stopped_early}" if report.stopped_early else ""
    return (
        f"# Adaptation chosen on dev: {ARM_NAMES[report.chosen]}\n\n{report.reason}\n\n"
        f"{to_markdown(adaptation_view(report))}{stopped}\n"
    )
