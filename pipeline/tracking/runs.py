"""MLflow tracking of the pipeline: one parent run per pipeline execution, one child per stage that ran.

Where runs go is environment, not params: ``MLFLOW_TRACKING_URI`` (a server such as
``http://127.0.0.1:5000``) or, by default, ``sqlite:///<project>/mlflow.db`` with artifacts in
``<project>/mlartifacts/``. ``mlflow`` is imported lazily (about 2 s), only by stages that log.

Stages run in separate processes (``dvc repro`` starts one per stage), so the parent run is found
through, in this order:

1. ``ADAPTBERT_PARENT_RUN_ID`` in the environment (set by the Prefect flow, or by hand);
2. the run-context file ``.adaptbert/mlflow-run.json``, which ties the parent to the ``dvc``
   process that started this stage (its pid and start time): every stage of one ``dvc repro``
   attaches to the same parent, the next ``dvc repro`` opens a new one;
3. otherwise (a stage started by hand) a new parent for this stage alone.

Skipped stages never start a process, so they log nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.core.config import Config
from pipeline.core.errors import TrackingUnavailable
from pipeline.core.paths import Paths

if TYPE_CHECKING:  # a type only: the tracking section changes no stage output
    from pipeline.core.sections.tracking import TrackingConfig

PARENT_ENV = "ADAPTBERT_PARENT_RUN_ID"

# What each stage's child run records besides params: the report whose numbers become metrics,
# and the files/folders logged as artifacts (those that exist).
STAGE_REPORT: dict[str, str] = {
    "ingest": "ingest_report",
    "validate": "validation_report",
    "tokenize": "tokenize_report",
    "pretrain": "pretrain_report",
    "finetune": "finetune_report",
    "evaluate": "metrics",
    "compress": "compression_report",
    "register": "promotion_report",
}
STAGE_ARTIFACTS: dict[str, tuple[str, ...]] = {
    "ingest": ("ingest_report",),
    "validate": ("validation_report", "data_docs"),
    "tokenize": ("tokenize_report",),
    "pretrain": ("pretrain_report", "pretrain_curves"),
    "finetune": ("finetune_report", "finetune_curves"),
    "evaluate": ("metrics", "evaluation", "plots"),
    "compress": ("compression_report", "compression_markdown", "compression_plots"),
    "register": ("promotion_report",),
}


# Config sections a stage reads: logged as the child's params (the parent gets the whole config).
def stage_params(root: Path, stage: str) -> tuple[str, ...]:
    """The params a stage reads, as ``dvc.yaml`` declares them (``section`` or ``section.key``): one source for
    DVC (what re-runs the stage) and MLflow (what its run logs). Without a ``dvc.yaml`` (a library call in a
    bare directory): the stage's own section."""
    dvc_yaml = root / "dvc.yaml"
    if not dvc_yaml.exists():
        return (stage,)
    stages = (yaml.safe_load(dvc_yaml.read_text(encoding="utf-8")) or {}).get("stages", {})
    declared = stages.get(stage, {}).get("params") or [stage]
    return tuple(p for p in declared if isinstance(p, str))


# ----------------------------------------------------------------------------- where, and connecting


def tracking_uri(paths: Paths) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the project's sqlite file (absolute, so any cwd works)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(paths.root / 'mlflow.db').resolve()}"


def is_local(uri: str) -> bool:
    return uri.startswith("sqlite:")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing): serialises processes on this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def configure_requests(tc: TrackingConfig) -> None:
    """Bounded retries with exponential backoff for every request MLflow makes (user env wins)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(tc.retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", str(tc.retry_backoff_s))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(tc.request_timeout_s))
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stage logs, not terminals


def connect(tc: TrackingConfig, paths: Paths) -> tuple[Any, str]:
    """A client and the experiment id, creating the store and experiment once.

    A local sqlite store is created (schema migrations) under a file lock, so that processes
    started together never race on the migration; a server that stays unreachable after the
    bounded retries raises :class:`TrackingUnavailable` naming the URL.
    """
    import mlflow
    from mlflow import MlflowClient

    configure_requests(tc)
    uri = tracking_uri(paths)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    lock = paths.root / ".adaptbert" / "mlflow-store.lock" if is_local(uri) else None
    try:
        with file_lock(lock) if lock else nullcontext():
            exp = client.get_experiment_by_name(tc.experiment)
            if exp is not None:
                return client, exp.experiment_id
            location = (paths.root / "mlartifacts").resolve().as_uri() if is_local(uri) else None
            return client, client.create_experiment(tc.experiment, artifact_location=location)
    except Exception as err:  # MlflowException, requests' ConnectionError, sqlite errors: all mean "no store"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TrackingUnavailable(
            f"MLflow tracking store {uri} is unreachable after {tc.retries} retries "
            f"(backoff {tc.retry_backoff_s} s, timeout {tc.request_timeout_s} s): {first}. "
            "Start the server or unset MLFLOW_TRACKING_URI to use the local sqlite store."
        ) from None


# ----------------------------------------------------------------------------- lineage


def git_state(root: Path) -> dict[str, str]:
    """``git.commit`` and ``git.dirty`` of the project (``unknown`` outside a git repository).

    Dirty means uncommitted changes to tracked code or params; the pipeline's own outputs that git
    also tracks (``reports/``, ``dvc.lock``) change with every run and are covered by the ``dvc.*`` tags.
    """

    def git(*args: str) -> str | None:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git.commit": "unknown", "git.dirty": "unknown"}
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports", ":(exclude)dvc.lock")
    return {"git.commit": commit, "git.dirty": str(bool(dirty)).lower()}


def dvc_lock_hashes(root: Path) -> dict[str, str]:
    """``dvc.<stage>.<out path>`` -> content hash of every out recorded in ``dvc.lock``."""
    lock = root / "dvc.lock"
    if not lock.exists():
        return {}
    stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages", {})
    tags = {}
    for stage, entry in stages.items():
        for out in entry.get("outs", []):
            value = out.get("md5") or out.get(out.get("hash", ""), "")
            if value:
                tags[f"dvc.{stage}.{out['path']}"] = str(value)
    return tags


def lineage_tags(paths: Paths) -> dict[str, str]:
    """Git commit and dirty flag, the ``dvc.lock`` hash of each stage's outs, and the data hash.

    The data hash is ingest's outs from ``dvc.lock`` (what ``dvc checkout`` restores); a stage run
    outside DVC hashes the task files themselves.
    """
    import hashlib

    from pipeline.core.io import data_digest

    tags = {**git_state(paths.root), **dvc_lock_hashes(paths.root)}
    ingest = sorted(v for k, v in tags.items() if k.startswith("dvc.ingest."))
    if ingest:
        tags["data_hash"] = hashlib.sha256("\n".join(ingest).encode()).hexdigest()[:32]
    elif paths.tasks.exists():
        tags["data_hash"] = data_digest([paths.tasks])[:32]
    return tags


# ----------------------------------------------------------------------------- params and metrics


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def as_params(cfg: Config, keys: tuple[str, ...] | None = None) -> dict[str, str]:
    """The resolved config, flattened to ``section.key`` strings (MLflow caps a value at 6000 chars).

    ``keys``: only these sections or dotted keys (``"pretrain"``, ``"pretrain.base_model"``), as dvc.yaml names them.
    """
    flat = flatten(cfg.model_dump(mode="json", by_alias=True))
    if keys is not None:
        flat = {k: v for k, v in flat.items() if any(k == key or k.startswith(f"{key}.") for key in keys)}
    return {
        k: (json.dumps(v, ensure_ascii=False) if isinstance(v, list | dict) else str(v))[:6000] for k, v in flat.items()
    }


def numeric_leaves(report: Any) -> dict[str, float]:
    """Every int/float in a report, flattened; MLflow-safe keys (booleans and text are skipped)."""
    import re

    out = {}
    for k, v in flatten(report).items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[re.sub(r"[^0-9A-Za-z_\-. :/]", "_", k)[:250]] = float(v)
    return out


# ----------------------------------------------------------------------------- parent and child runs


def pipeline_owner() -> dict[str, Any] | None:
    """The ``dvc`` process (pid, start time) that started this stage, if any."""
    import psutil

    for proc in psutil.Process().parents():
        try:
            cmd = proc.cmdline()
            if any(Path(a).name == "dvc" for a in cmd[:2]) or cmd[1:3] == ["-m", "dvc"]:
                return {"pid": proc.pid, "create_time": proc.create_time()}
        except psutil.Error:
            continue
    return None


def parent_run(client: Any, experiment_id: str, cfg: Config, paths: Paths) -> str:
    """The id of this pipeline execution's parent run (see the module docstring), created if new."""
    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    owner = pipeline_owner()
    uri = tracking_uri(paths)
    context = paths.run_context
    with file_lock(context.with_suffix(".lock")):
        if owner and context.exists():
            saved = json.loads(context.read_text(encoding="utf-8"))
            if saved.get("owner") == owner and saved.get("tracking_uri") == uri:
                return str(saved["run_id"])
        run_id = create_parent_run(
            client,
            experiment_id,
            cfg,
            paths,
            f"pipeline {time.strftime('%Y-%m-%d %H:%M:%S')}",
            "dvc" if owner else "cli",
        )
        if owner:
            context.write_text(
                json.dumps({"run_id": run_id, "owner": owner, "tracking_uri": uri}) + "\n", encoding="utf-8"
            )
        return run_id


def create_parent_run(client: Any, experiment_id: str, cfg: Config, paths: Paths, name: str, trigger: str) -> str:
    """A new pipeline-execution run: lineage tags, the whole resolved config as params; returns its id."""
    run = client.create_run(
        experiment_id,
        run_name=name,
        tags={**lineage_tags(paths), "adaptbert.kind": "pipeline", "adaptbert.trigger": trigger},
    )
    log_params(client, run.info.run_id, as_params(cfg))
    return str(run.info.run_id)


def log_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[i : i + 100])


def log_report(client: Any, run_id: str, stage: str, paths: Paths) -> None:
    """The stage report's numbers as metrics and its files as artifacts (those that exist)."""
    from mlflow.entities import Metric

    report = getattr(paths, STAGE_REPORT[stage]) if stage in STAGE_REPORT else None
    if report is not None and report.exists():
        now = int(time.time() * 1000)
        metrics = [
            Metric(k, v, now, 0) for k, v in numeric_leaves(json.loads(report.read_text(encoding="utf-8"))).items()
        ]
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
    log_artifacts(client, run_id, stage, paths)


def log_artifacts(client: Any, run_id: str, stage: str, paths: Paths) -> None:
    for name in STAGE_ARTIFACTS.get(stage, ()):
        path = getattr(paths, name)
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)
        elif path.is_file():
            client.log_artifact(run_id, str(path))


def in_worker_process() -> bool:
    """True inside a process that ``torchrun`` started: the launching process owns the run."""
    return "WORLD_SIZE" in os.environ


@contextmanager
def stage_run(cfg: Config, paths: Paths, stage: str, required: bool = False) -> Iterator[str | None]:
    """A child run of this pipeline execution around one stage; yields its id (``None`` when not tracking).

    On success the stage report's numbers and files are logged and the run (and its parent) end
    ``FINISHED``; on failure the error is tagged, the validation report (if the stage wrote one)
    logged, and both end ``FAILED``; the exception propagates unchanged. ``required`` stages
    (register) log even with ``tracking.enabled: false``.
    """
    if in_worker_process() or not (cfg.tracking.enabled or required):
        yield None
        return
    import mlflow

    client, experiment_id = connect(cfg.tracking, paths)
    parent = parent_run(client, experiment_id, cfg, paths)
    client.update_run(parent, status="RUNNING")
    run = mlflow.start_run(
        experiment_id=experiment_id,
        run_name=stage,
        parent_run_id=parent,
        tags={**lineage_tags(paths), "adaptbert.kind": "stage", "adaptbert.stage": stage},
    )
    run_id = run.info.run_id
    log_params(client, run_id, as_params(cfg, stage_params(paths.root, stage)))
    try:
        yield run_id
    except BaseException as err:
        client.set_tag(run_id, "error", str(err)[:5000])
        if stage == "validate":
            log_artifacts(client, run_id, stage, paths)
        mlflow.flush_async_logging()
        mlflow.end_run("FAILED")
        client.set_terminated(parent, "FAILED")
        raise
    mlflow.flush_async_logging()
    log_report(client, run_id, stage, paths)
    mlflow.end_run("FINISHED")
    client.set_terminated(parent, "FINISHED")


@contextmanager
def nested_run(name: str) -> Iterator[str | None]:
    """A run nested in the active stage run (one per fine-tuned model); nothing when none is active."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        yield None
        return
    run = mlflow.start_run(run_name=name, nested=True, experiment_id=mlflow.active_run().info.experiment_id)
    try:
        yield run.info.run_id
    except BaseException:
        mlflow.flush_async_logging()
        mlflow.end_run("FAILED")
        raise
    mlflow.flush_async_logging()
    mlflow.end_run("FINISHED")


def trainer_report_to() -> list[str] | str:
    """``["mlflow"]`` when a run is active here (the Trainer's callback then logs into it), else ``"none"``.

    A ``torchrun`` worker sees the launcher's run through ``MLFLOW_RUN_ID`` (:func:`worker_env`).
    """
    mlflow = sys.modules.get("mlflow")
    active = mlflow is not None and mlflow.active_run() is not None
    return ["mlflow"] if active or (in_worker_process() and os.environ.get("MLFLOW_RUN_ID")) else "none"


def worker_env() -> dict[str, str]:
    """Environment for ``torchrun`` workers so that rank 0's Trainer logs into the active stage run."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return {}
    return {"MLFLOW_RUN_ID": mlflow.active_run().info.run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}
