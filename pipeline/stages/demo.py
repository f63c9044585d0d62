"""demo stage: write the seeded synthetic pharmacology domain (``pipeline.text.demo_domain``) to ``data/demo/``."""

from __future__ import annotations

from typing import Any

from pipeline.core.config import Config
from pipeline.core.paths import Paths
from pipeline.text import demo_domain


def run(cfg: Config, paths: Paths) -> dict[str, int]:
    """(Re)write the demo domain atomically into ``data/demo/``; file counts per kind."""
    return demo_domain.run(cfg.demo, paths.demo)


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console line of ``python -m pipeline demo``."""
    tasks = sorted({k.rsplit("_", 1)[0] for k in r if k != "corpus_docs"})
    return f"wrote {r['corpus_docs']} synthetic trial reports and tasks {tasks} to {paths.demo}/"
