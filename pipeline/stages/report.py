"""report stage (after register): ``reports/index.html``, the run on one page that opens offline.

It reads the stage reports (``pipeline.reporting.html`` says what each section shows) and writes
one self-contained HTML file: no CDN, every image embedded, so it can be mailed, attached to a
ticket or opened from an MLflow artifact. A stage that never ran leaves its section out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.io import read_report, write_text
from pipeline.core.paths import Paths
from pipeline.reporting.html import render
from pipeline.tracking.lineage import git_state


def optional_report(path: Path, producer: str) -> dict[str, Any] | None:
    """A stage report with its measurements, or ``None`` when that stage has not run."""
    return read_report(path, producer) if path.exists() else None


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Write ``reports/index.html`` from the reports on disk; what it holds."""
    reports = {
        "ingest": optional_report(paths.ingest_report, "ingest"),
        "validation": optional_report(paths.validation_report, "validate"),
        "tokenize": optional_report(paths.tokenize_report, "tokenize"),
        "pretrain": optional_report(paths.pretrain_report, "pretrain"),
        "search": optional_report(paths.search_report, "search"),
        "metrics": optional_report(paths.metrics, "evaluate"),
        "compression": optional_report(paths.compression_report, "compress"),
        "promotion": optional_report(paths.promotion_report, "register"),
        "summary": optional_report(paths.summary, "register"),
    }
    dirs = {"pretrain_curves": paths.pretrain_curves, "plots": paths.plots, "compression": paths.compression_plots}
    html = render(reports, dirs, git_state(paths.root)["git.commit"])
    write_text(paths.run_report, html)
    return {
        "sections": [name for name, r in reports.items() if r is not None],
        "bytes": len(html.encode("utf-8")),
        "images": html.count("<img "),
    }


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console line of ``python -m pipeline report``."""
    return f"{paths.run_report} ({r['bytes'] / 1e6:.1f} MB, {r['images']} images embedded; open it in a browser)"
