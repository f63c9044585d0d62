"""report stage (after register): ``reports/index.html``, the run on one page that opens offline.

It reads the stage reports (``pipeline.reporting.html`` says what each section shows) and writes
one self-contained HTML file: no CDN, every image embedded, so it can be mailed, attached to a
ticket or opened from an MLflow artifact. A stage that never ran leaves its section out.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import Config
from pipeline.core.io import read_report_if_any, write_text
from pipeline.core.paths import Paths
from pipeline.core.reports.kinds import TYPED_REPORTS
from pipeline.core.stages import producer_of
from pipeline.reporting.html import render
from pipeline.tracking.lineage import git_state

# the reports the page is made from, as Paths attributes
PAGE_REPORTS = (
    "ingest_report",
    "validation_report",
    "tokenize_report",
    "adapt_report",
    "pretrain_report",
    "search_report",
    "metrics",
    "errors",
    "compression_report",
    "promotion_report",
)


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Write ``reports/index.html`` from the reports on disk; what it holds."""
    reports: dict[str, Any] = {name: page_report(paths, name) for name in PAGE_REPORTS}
    dirs = {"pretrain_curves": paths.pretrain_curves, "plots": paths.plots, "compression": paths.compression_plots}
    html = render(reports, dirs, git_state(paths.root)["git.commit"], this_execution())
    write_text(paths.run_report, html)
    return {
        "stages": list(dict.fromkeys(producer_of(getattr(paths, n)) for n, r in reports.items() if r is not None)),
        "bytes": len(html.encode("utf-8")),
        "images": html.count("<img "),
    }


def page_report(paths: Paths, name: str) -> Any:
    """The report ``name`` (a Paths attribute) as its type where it has one, else as a dict; ``None`` if absent."""
    path = getattr(paths, name)
    kind = TYPED_REPORTS.get(name)
    return read_report_if_any(path, kind) if kind else read_report_if_any(path)


def this_execution() -> dict[str, Any] | None:
    """The pipeline execution this report ends (its MLflow parent run and the time of each stage that ran in it),
    or None when this stage is not tracked (``tracking.enabled: false``: MLflow holds no times)."""
    import sys

    # a tracked stage runs inside pipeline.tracking.runs.stage_run, which imported mlflow and started its run; the
    # tracking section is no input of this stage (it changes no output DVC versions), so it is not read here
    if "mlflow" not in sys.modules:
        return None
    import mlflow

    from pipeline.tracking.runs import stage_times

    run = mlflow.active_run()
    if run is None:
        return None
    parent, stages = stage_times(run.info.run_id)
    return {"parent_run_id": parent, "stages": stages}


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console line of ``python -m pipeline report``."""
    return f"{paths.run_report} ({r['bytes'] / 1e6:.1f} MB, {r['images']} images embedded; open it in a browser)"
