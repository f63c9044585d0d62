"""Prefect flows and deployments over the DVC stages (wiring only; no ML logic here).

``pipeline/`` never imports Prefect. ``PREFECT_HOME`` defaults to the project-local ``.prefect/``
(set before Prefect is first imported), so a test or a second project never shares a database
with another; export ``PREFECT_HOME`` to put it elsewhere.
"""

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PREFECT_HOME", str(PROJECT_ROOT / ".prefect"))
