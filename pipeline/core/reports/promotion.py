"""``reports/promotion.json``: what the register stage did in the registry: the versions it created, the model the
serving rule proposed (``challenger``) and why, the gate's verdict against ``champion`` with the rows behind it, and
where to find it all in MLflow.

Not versioned (git-ignored, not DVC-cached: it names this machine's MLflow runs), so it is written whole, sealed,
with its ``seconds``. Fields are declared in the order the stage writes them.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.reports.base import StageReport
from pipeline.core.reports.compression import FULL


class ServingCandidate(StageReport):
    """A variant the serving rule weighed against the full model: its latency, score, and why it does (not) qualify."""

    model: str
    p50_ms: float | None  # batch-1, in the precision it is served in; None where not timed
    mean_primary: float
    ok: bool
    why: str  # the problems, ``; ``-joined (empty: it qualifies)


class Serving(StageReport):
    """``register.serve``: the model proposed as ``challenger``, why, the rule as configured and its candidates."""

    choice: str  # "full" or a variant
    reason: str
    rule: dict[str, Any]  # register.serve as configured
    candidates: list[ServingCandidate]


class GateRow(StageReport):
    """A primary test metric (``task.metric``) of the challenger beside the champion's, and the rule it must meet."""

    metric: str
    challenger: float | None
    champion: float | None
    delta: float | None
    check: str
    ok: bool


class PromotionReport(StageReport):
    """reports/promotion.json."""

    model_name: str
    profile: str | None  # the profile the run belongs to (its own registered model), None: params.yaml as it is
    version: str  # the version ``challenger`` points at
    model_uri: str
    run_id: str  # the register stage's MLflow run
    parent_run_id: str | None  # the pipeline execution's run
    experiment_id: str
    tracking_uri: str  # without a password: a link base
    fill_mask_model_uri: str | None
    versions: dict[str, str]  # model ("full", variant) -> the version created for it
    serving: Serving
    not_registered: dict[str, str]  # variants below compress.accuracy_floor, and why
    promoted: bool
    reason: str  # the gate's verdict in one sentence
    champion_before: str | None
    champion_after: str | None
    mean_primary_challenger: float | None
    mean_primary_champion: float | None
    table: list[GateRow]
    rules: dict[str, Any]  # register as configured
    seconds: float | None = None

    def registered(self) -> str:
        """``v3 (full model), v4 (int8)``: every version this run created."""
        return ", ".join(f"v{v} ({'full model' if n == FULL else n})" for n, v in self.versions.items())
