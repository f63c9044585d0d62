"""``adaptbert history``: every pipeline execution of an experiment side by side, from MLflow.

Per execution (a parent run): when, how it was triggered, its git commit, the headline (mean primary adapted and
baseline, the gain, on how many tasks the gain's CI clears 0, from its evaluate stage run), what was served, and the
params that differ between the executions listed; then the champion's timeline from the registry's version tags
(``promoted_at``, ``previous_champion``, ``promotion.forced``, ``rolled_back_from``); then the DVC experiments of the
current commit (``dvc exp show``: each experiment's headline from ``reports/summary.json`` and the params it set),
joined to their MLflow executions by the experiment name (``adaptbert.dvc_exp``). Written as
``reports/history.html`` (self-contained, like the run report) and printed as tables.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import redact_secrets
from pipeline.core.paths import Paths
from pipeline.core.stages import producer_of
from pipeline.reporting.headline import execution_headline
from pipeline.reporting.numbers import points

if TYPE_CHECKING:
    from pipeline.core.config import Config

PARENTS = "tags.`adaptbert.kind` = 'pipeline'"


def executions(client: Any, experiment_id: str, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` pipeline executions of the experiment, newest first, each with its headline."""
    ids = [experiment_id]
    parents = client.search_runs(ids, PARENTS, order_by=["attributes.start_time DESC"], max_results=limit)
    scoring = producer_of(Paths(Path()).metrics)  # the stage whose run holds the gain's CIs
    evaluated = {
        r.data.tags.get("mlflow.parentRunId"): r
        for r in client.search_runs(ids, f"tags.`adaptbert.stage` = '{scoring}'", max_results=1000)
    }
    rows = []
    for p in parents:
        m = p.data.metrics
        scored = evaluated[p.info.run_id].data.metrics if p.info.run_id in evaluated else {}
        rows.append(
            {
                "run_id": p.info.run_id,
                "name": p.info.run_name,
                "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(p.info.start_time / 1000)),
                "status": p.info.status,
                "trigger": trigger_text(p.data.tags),
                "dvc_exp": p.data.tags.get("adaptbert.dvc_exp"),
                "profile": p.data.tags.get("adaptbert.profile"),
                "commit": p.data.tags.get("git.commit", "")[:10],
                # evaluate's own digits (metrics.json), as the run report reads them; the parent's summary.json
                # metrics keep four places, which can round a tenth apart (0.78549 -> 0.7855)
                "adapted": scored.get("summary.mean_primary_adapted", m.get("adapted")),
                "baseline": scored.get("summary.mean_primary_baseline", m.get("baseline")),
                "gain": scored.get("summary.mean_primary_delta", m.get("gain")),
                "gain_low": scored.get("summary.mean_primary_delta_low"),
                "gain_high": scored.get("summary.mean_primary_delta_high"),
                "tasks": sum(k.endswith(".ci_low") for k in scored),
                "ci_above_0": int(n) if (n := scored.get("summary.tasks_improved_significantly")) is not None else None,
                "served": p.data.tags.get("adaptbert.served"),
                "params": {k: redact_secrets(v) for k, v in p.data.params.items()},  # runs logged before redaction
            }
        )
    return rows


def trigger_text(tags: dict[str, str]) -> str:
    """How an execution was started: ``dvc``, ``prefect``, ``cli``, or ``dvc exp <name>`` inside ``dvc exp run``."""
    exp = tags.get("adaptbert.dvc_exp")
    return f"dvc exp {exp}" if exp else tags.get("adaptbert.trigger", "")


HEADLINE = ("adapted", "gain", "served")  # reports/summary.json's keys shown per experiment


def dvc_experiments(root: Path, sections: set[str]) -> list[dict[str, Any]]:
    """The DVC experiments of the commit checked out in ``root`` (``dvc exp show`` through ``dvc.api.exp_show``), in
    its order: name, when, the commit, the headline of its ``reports/summary.json`` and the params (``sections``: the
    config's top-level keys) it set to another value than that commit. Empty where ``root`` is no DVC repository (or
    one without a commit) or has no experiment."""
    import dvc.api
    from dvc.exceptions import DvcException
    from dvc.scm import SCMError

    if not (root / ".dvc").is_dir():
        return []
    try:
        rows = dvc.api.exp_show(repo=str(root))
    except (DvcException, SCMError):  # e.g. a repository without a commit yet
        return []
    experiments, baseline = [], None
    for row in rows:
        if row["typ"] == "baseline":
            baseline = None if row["rev"] == "workspace" else row
            continue
        if baseline is None or not row.get("Experiment"):
            continue
        params = {k: v for k, v in row.items() if k.split(".")[0] in sections}
        experiments.append(
            {
                "name": row["Experiment"],
                "created": row.get("Created") or "",
                "commit": baseline["rev"],  # what it was run from
                **{k: shown_value(row.get(k)) for k in HEADLINE},
                "set": {k: shown_param(v) for k, v in params.items() if v != baseline.get(k)},
            }
        )
    return experiments


def experiments_text(experiments: list[dict[str, Any]], rows: list[dict[str, Any]], shown_params: int = 4) -> str:
    """The DVC experiments as a plain table for the console (the params each set, the first ``shown_params``)."""
    from pipeline.tracking.models_cli import table

    logged = {r["dvc_exp"] for r in rows if r["dvc_exp"]}
    body = []
    for e in experiments:
        items = [f"{k}={v}" for k, v in e["set"].items()]
        more = f" (+{len(items) - shown_params} more)" if len(items) > shown_params else ""
        body.append(
            [
                e["name"],
                e["created"],
                points(e["adapted"]),
                points(e["gain"], signed=True),
                e["served"] or "-",
                "yes" if e["name"] in logged else "no",
                ", ".join(items[:shown_params]) + more or "-",
            ]
        )
    header = ["experiment", "created", "adapted", "gain", "served", "in MLflow", "params set"]
    return f"DVC experiments of {experiments[0]['commit']} (dvc exp show):\n" + table(header, body)


def shown_param(value: Any) -> Any:
    """A param value of ``dvc exp show`` as a person reads it: ``14`` for the ``14.0`` it makes of an integer, text
    without the secrets a URI may carry (``ray.address``, a source's URL); anything else as it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return redact_secrets(value) if isinstance(value, str) else value


def shown_value(value: Any) -> Any:
    """A headline value of ``dvc exp show`` as it is, or None where it is empty or unreadable (DVC shows ``!``)."""
    return None if value in (None, "!") else value


def differing_params(rows: list[dict[str, Any]]) -> list[str]:
    """The params whose value is not the same in every execution listed (a missing one counts as a value)."""
    keys = sorted({k for r in rows for k in r["params"]})
    return [k for k in keys if len({r["params"].get(k) for r in rows}) > 1]


def champion_timeline(client: Any, model_name: str) -> list[dict[str, Any]]:
    """Every version that became champion, in the order it did (``promoted_at``), with what it replaced."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = '{model_name}'")
    except MlflowException:
        return []
    moves = [
        {
            "version": str(v.version),
            "at": v.tags["promoted_at"],
            "replaced": v.tags.get("previous_champion") or None,
            "forced": v.tags.get("promotion.forced") == "true",
            "rolled_back_from": v.tags.get("rolled_back_from"),
        }
        for v in versions
        if v.tags.get("promoted_at")
    ]
    return sorted(moves, key=lambda m: m["at"])


def history_text(rows: list[dict[str, Any]], differing: list[str]) -> str:
    """The executions as a plain table (newest first) for the console."""
    from pipeline.tracking.models_cli import table

    body = [
        [
            r["started"],
            r["trigger"] + (f" ({r['profile']})" if r["profile"] else ""),
            r["status"].lower(),
            r["commit"],
            execution_headline(r),
            "-" if r["ci_above_0"] is None else f"{r['ci_above_0']}/{r['tasks']}",
            r["served"] or "-",
        ]
        for r in rows
    ]
    header = ["started", "trigger", "status", "commit", "mean primary (points)", "CI>0", "served"]
    note = f"\nparams that differ: {', '.join(differing)}" if differing else "\nparams: the same in every execution"
    return table(header, body) + note


def write_history(cfg: Config, paths: Paths) -> int:
    """``adaptbert history``: ``reports/history.html`` and the table on stdout, for the config's experiment and
    registered model (a profile's with ``--profile``)."""
    from pipeline.core.console import quiet_libraries
    from pipeline.core.io import write_text
    from pipeline.core.mlflow_ui import ui_base
    from pipeline.reporting.html import history_page
    from pipeline.tracking.runs import connect, store_errors, tracking_uri

    quiet_libraries()
    experiment, model = cfg.tracking.experiment, cfg.registration.model_name
    # a store that is locked, read-only, or missing a table is one line and exit 4 (was: SQLAlchemy's traceback)
    with store_errors(paths):
        client, experiment_id = connect(cfg.tracking, paths)  # creates the experiment if new: then no rows
        rows = executions(client, experiment_id)
        timeline = champion_timeline(client, model)
    differing = differing_params(rows)
    experiments = dvc_experiments(paths.root, set(cfg.model_dump(by_alias=True)))
    out = paths.reports / "history.html"
    ui = ui_base(tracking_uri(paths))
    write_text(out, history_page(rows, differing, timeline, experiments, experiment, model, ui))
    print(history_text(rows, differing) if rows else f"no pipeline runs in experiment '{experiment}' yet")
    if experiments:
        print("\n" + experiments_text(experiments, rows))
    print(f"history: {out}")
    return 0
