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
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import TrackingUnavailable, redact_secrets
from pipeline.core.mlflow_ui import mlflow_ui_page
from pipeline.core.paths import Paths
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.reports.promotion import PromotionReport
from pipeline.core.stages import stage_record
from pipeline.tracking.lineage import dvc_file_stages, lineage_tags
from pipeline.tracking.store_root import reroot_local_store

if TYPE_CHECKING:  # types only: the tracking section changes no stage output; the config is read, never built, here
    from pipeline.core.config import Config
    from pipeline.core.sections.tracking import TrackingConfig

PARENT_ENV = "ADAPTBERT_PARENT_RUN_ID"
PARENT_REPORT_DIR = "report"  # the parent run's artifact folder holding reports/index.html


def run_page(paths: Paths, run_id: str, artifact: str | None = None) -> str:
    """The MLflow UI address of run ``run_id`` (or of one of its artifacts, which the UI shows, HTML rendered): on the
    tracking server for an http store, else where ``mlflow ui`` serves the local store by default."""
    from mlflow import MlflowClient

    uri = tracking_uri(paths)
    experiment = MlflowClient(uri).get_run(run_id).info.experiment_id
    base = redact_secrets(uri).rstrip("/") if uri.startswith("http") else "http://127.0.0.1:5000"
    route = f"experiments/{experiment}/runs/{run_id}" + (f"/artifactPath/{artifact}" if artifact else "")
    return mlflow_ui_page(route, base)


STORE_ADVICE = (
    "A locked database clears when the other process ends (the Prefect flow retries this); a read-only or damaged "
    "mlflow.db or mlartifacts/: fix its permissions, or move it aside to start a new store"
)
# a server that proxies artifacts (mlflow server --serve-artifacts) answers 500 when its own store refuses the upload
PROXY_ADVICE = (
    "The tracking server's artifact store refused it (a bucket that is missing or full, or credentials it rejects: "
    "the server's log names which)"
)
# MLflow 3's UI asks which kind an experiment is until this tag says so; the view it opens (runs or GenAI) follows the
# address's workflowType (core/mlflow_ui.py), not this tag (tests/e2e/test_mlflow_ui.py)
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


# Config sections a stage reads: logged as the child's params (the parent gets the whole config).
def stage_params(root: Path, stage: str) -> tuple[str, ...]:
    """The params a stage reads, as ``dvc.yaml`` declares them (``section`` or ``section.key``): one source for
    DVC (what re-runs the stage) and MLflow (what its run logs). Without a ``dvc.yaml`` (a library call in a
    bare directory): the stage's own section."""
    dvc_yaml = root / "dvc.yaml"
    if not dvc_yaml.exists():
        return (stage,)
    stages = dvc_file_stages(dvc_yaml)
    declared = stages.get(stage, {}).get("params") or [stage]
    return tuple(p for p in declared if isinstance(p, str))


# ----------------------------------------------------------------------------- where, and connecting


def tracking_uri(paths: Paths) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the project's sqlite file (absolute, so any cwd works)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or project_store_uri(paths)


def project_store_uri(paths: Paths) -> str:
    """The project's own store: ``mlflow.db`` in its root (artifacts in ``mlartifacts/`` beside it)."""
    return f"sqlite:///{(paths.root / 'mlflow.db').resolve()}"


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
    if redact_secrets(uri) != uri:  # MLflow prints "View run ... at: <the URI as given>", password and all
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    mlflow.set_tracking_uri(uri)
    lock = paths.root / ".adaptbert" / "mlflow-store.lock" if is_local(uri) else None
    try:
        with file_lock(lock) if lock else nullcontext():
            if uri == project_store_uri(paths) and (moved := reroot_local_store(paths.root / "mlflow.db", paths.root)):
                print(
                    f"MLflow store: its locations pointed at {', '.join(map(str, moved))}; re-rooted at {paths.root.resolve()} "
                    "(a copied or moved checkout now reads and writes its own mlartifacts/)",
                    file=sys.stderr,
                )
            client = MlflowClient(uri)  # opens the store: a local one is created (migrated) here, under the lock
            exp = client.get_experiment_by_name(tc.experiment)
            if exp is not None:
                if exp.tags.get(EXPERIMENT_KIND[0]) is None:
                    client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
                return client, exp.experiment_id
            location = (paths.root / "mlartifacts").resolve().as_uri() if is_local(uri) else None
            tags = dict([EXPERIMENT_KIND])
            return client, client.create_experiment(tc.experiment, artifact_location=location, tags=tags)
    except Exception as err:  # MlflowException, requests' ConnectionError, sqlite errors: all mean "no store"
        first = first_line(err) or type(err).__name__
        if is_local(uri):  # no server to start: the file itself is locked, read-only or damaged
            raise TrackingUnavailable(
                f"MLflow tracking store {uri} cannot be opened: {type(err).__name__}: {first[:300]}. {STORE_ADVICE}"
            ) from None
        raise TrackingUnavailable(
            f"MLflow tracking store {redact_secrets(uri)} is unreachable after {tc.retries} retries "
            f"(backoff {tc.retry_backoff_s} s, timeout {tc.request_timeout_s} s): {first}. "
            "Start the server or unset MLFLOW_TRACKING_URI to use the local sqlite store."
        ) from None


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
    """The resolved config, flattened to ``section.key`` strings (MLflow caps a value at 6000 chars), secrets redacted.

    ``keys``: only these sections or dotted keys (``"pretrain"``, ``"pretrain.base_model"``), as dvc.yaml names them.
    """
    flat = flatten(cfg.model_dump(mode="json", by_alias=True))
    if keys is not None:
        flat = {k: v for k, v in flat.items() if any(k == key or k.startswith(f"{key}.") for key in keys)}
    # a URI-capable setting (ray.address, a source's URL) may carry a password: params leave the process redacted
    return {
        k: redact_secrets(json.dumps(v, ensure_ascii=False) if isinstance(v, list | dict) else str(v))[:6000]
        for k, v in flat.items()
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


# psutil's create_time is the process's start in clock ticks since boot plus the boot time, which Linux derives from the
# wall clock: a clock step (NTP) moves it by a second or so between two stages of one `dvc repro` (seen in CI: the last
# stage then opened a second parent run). Same pid and starts this close are the same process: a pid is not reused
# within seconds of the start of the process that held it.
OWNER_START_TOLERANCE_S = 5.0


def same_owner(saved: Any, owner: dict[str, Any]) -> bool:
    """Whether ``saved`` (a run context's owner) is the ``dvc`` process ``owner`` (:func:`pipeline_owner`)."""
    if not isinstance(saved, dict) or saved.get("pid") != owner["pid"]:
        return False
    started = saved.get("create_time")
    return isinstance(started, int | float) and abs(started - owner["create_time"]) <= OWNER_START_TOLERANCE_S


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
            if same_owner(saved.get("owner"), owner) and saved.get("tracking_uri") == redact_secrets(uri):
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
                json.dumps({"run_id": run_id, "owner": owner, "tracking_uri": redact_secrets(uri)}) + "\n",
                encoding="utf-8",
            )
        return run_id


def stage_times(run_id: str) -> tuple[str, list[dict[str, Any]]]:
    """``(parent run id, [{stage, seconds, status}])`` of the pipeline execution that stage run ``run_id`` belongs to,
    in the order the stages started (``seconds`` is None for a run still going: the caller's own). Stages that DVC
    skipped ran in an earlier execution and are not listed."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(mlflow.get_tracking_uri())
    run = client.get_run(run_id)
    parent = run.data.tags.get("mlflow.parentRunId", run_id)
    children = client.search_runs(
        [run.info.experiment_id],
        f"tags.mlflow.parentRunId = '{parent}' and tags.`adaptbert.kind` = 'stage'",
        order_by=["attributes.start_time ASC"],
        max_results=100,
    )
    return parent, [
        {
            "stage": r.data.tags.get("adaptbert.stage", r.info.run_name),
            "seconds": round((r.info.end_time - r.info.start_time) / 1000, 1) if r.info.end_time else None,
            "status": r.info.status,
        }
        for r in children
    ]


def profile_tag(cfg: Config) -> dict[str, str]:
    """``{"adaptbert.profile": name}`` for a run whose params come from a profile (``tracking.profile``), else none."""
    return {"adaptbert.profile": cfg.tracking.profile} if cfg.tracking.profile else {}


def dvc_experiment_tag() -> dict[str, str]:
    """``{"adaptbert.dvc_exp": name}`` inside ``dvc exp run`` (DVC names the experiment in ``DVC_EXP_NAME``), else
    none: ``adaptbert history`` joins the execution to its row of ``dvc exp show`` by it."""
    name = os.environ.get("DVC_EXP_NAME")
    return {"adaptbert.dvc_exp": name} if name else {}


def create_parent_run(client: Any, experiment_id: str, cfg: Config, paths: Paths, name: str, trigger: str) -> str:
    """A new pipeline-execution run: lineage tags, the whole resolved config as params; returns its id."""
    run = client.create_run(
        experiment_id,
        run_name=name,
        tags={
            **lineage_tags(paths),
            **profile_tag(cfg),
            **dvc_experiment_tag(),
            "adaptbert.kind": "pipeline",
            "adaptbert.trigger": trigger,
        },
    )
    log_params(client, run.info.run_id, as_params(cfg))
    return str(run.info.run_id)


def log_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[i : i + 100])


def report_numbers(report: dict[str, Any], patterns: tuple[str, ...]) -> dict[str, float]:
    """The numbers of ``report`` whose dotted key matches one of ``patterns`` (MLflow-safe keys)."""
    from fnmatch import fnmatchcase

    return {k: v for k, v in numeric_leaves(report).items() if any(fnmatchcase(k, p) for p in patterns)}


def log_report(client: Any, run_id: str, stage: str, paths: Paths) -> None:
    """The stage report's headline numbers as metrics, its set-up facts as params (the stage's record in
    :mod:`pipeline.core.stages`), and its files as artifacts (those that exist)."""
    from mlflow.entities import Metric

    from pipeline.core.io import read_report

    record = stage_record(stage)
    report = getattr(paths, record.report) if record.report else None
    if report is not None and report.exists():
        numbers = read_report(report)
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, 0) for k, v in report_numbers(numbers, record.metrics).items()]
        client.log_batch(run_id, metrics=metrics)
        setup = report_numbers(numbers, record.setup)
        log_params(client, run_id, {k: f"{v:g}" for k, v in setup.items()})
    log_artifacts(client, run_id, stage, paths)


def log_artifacts(client: Any, run_id: str, stage: str, paths: Paths) -> None:
    for name in stage_record(stage).artifacts:
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

    Tagged with the hashes of the stage's inputs when it starts (``dvc.in.<path>``) and, on success, of its
    outputs (``dvc.out.<path>``, also set on its nested runs and, as ``dvc.<stage>.<path>``, on the parent):
    the values DVC then records in ``dvc.lock``. On success the stage report's numbers and files are logged
    and the run (and its parent) end ``FINISHED``; on failure the error is tagged, the validation report (if
    the stage wrote one) logged, and both end ``FAILED``; the exception propagates unchanged. ``required``
    stages (register) log even with ``tracking.enabled: false``.
    """
    if in_worker_process() or not (cfg.tracking.enabled or required):
        yield None
        return
    import mlflow

    from pipeline.tracking.lineage import stage_input_tags, stage_output_tags  # hashing: only when tracking

    client, experiment_id = connect(cfg.tracking, paths)
    inputs = {**stage_input_tags(paths, stage), **profile_tag(cfg), "adaptbert.kind": "stage", "adaptbert.stage": stage}
    with store_errors(paths):  # before any work: a store that fails here is TrackingUnavailable (retried)
        parent = parent_run(client, experiment_id, cfg, paths)
        client.update_run(parent, status="RUNNING")
        run = mlflow.start_run(experiment_id=experiment_id, run_name=stage, parent_run_id=parent, tags=inputs)
        run_id = run.info.run_id
        log_params(client, run_id, as_params(cfg, stage_params(paths.root, stage)))
    try:
        yield run_id
    except BaseException as err:
        try:
            with store_errors(paths):
                client.set_tag(run_id, "error", redact_secrets(str(err))[:5000])
                if stage_record(stage).report_failure:
                    log_artifacts(client, run_id, stage, paths)
                mlflow.flush_async_logging()
                end_orphaned_runs(client, experiment_id, run_id)
                mlflow.end_run("FAILED")
                client.set_terminated(parent, "FAILED")
        except TrackingUnavailable as store:  # the stage's own error is the one to report
            print(f"{stage}: the failure is not recorded in MLflow either: {store}", file=sys.stderr)
        raise
    try:  # the stage committed its outputs: a store failing now must not turn that success into a failed exit
        with store_errors(paths):
            finish_stage_run(client, experiment_id, run_id, parent, stage, paths, stage_output_tags(paths, stage))
    except TrackingUnavailable as store:
        print(
            f"{stage}: warning: outputs committed, but their run is not (fully) logged to MLflow: {store}",
            file=sys.stderr,
        )


def finish_stage_run(
    client: Any, experiment_id: str, run_id: str, parent: str, stage: str, paths: Paths, outputs: dict[str, str]
) -> None:
    """A successful stage's run: its output hashes (on it, its nested runs and the parent), report, headline."""
    import mlflow

    from pipeline.tracking.datasets import log_datasets

    mlflow.flush_async_logging()
    set_tags(client, [run_id, *nested_runs(client, experiment_id, run_id)], outputs)
    set_tags(client, [parent], {k.replace("dvc.out.", f"dvc.{stage}.", 1): v for k, v in outputs.items()})
    log_report(client, run_id, stage, paths)
    log_datasets(client, run_id, stage, paths)
    log_headline(client, parent, paths, outputs)
    mlflow.end_run("FINISHED")
    client.set_terminated(parent, "FINISHED")


@contextmanager
def store_errors(paths: Paths, kinds: tuple[type[BaseException], ...] = (Exception,)) -> Iterator[None]:
    """A failure of the MLflow store inside (sqlite locked, read-only or corrupt, artifacts not writable, a server
    gone) as :class:`TrackingUnavailable` (exit 4, which the Prefect flow retries), naming the store. ``kinds``: the
    errors that count as the store's (default: any, for code that only talks to the store)."""
    try:
        yield
    except TrackingUnavailable:
        raise
    except kinds as err:  # MlflowException, sqlalchemy's OperationalError, OSError of the artifact store ...
        advice = PROXY_ADVICE if "mlflow-artifacts" in str(err) else STORE_ADVICE
        raise TrackingUnavailable(
            f"MLflow tracking store {redact_secrets(tracking_uri(paths))} failed: {type(err).__name__}: "
            f"{first_line(err)[:300]}. {advice}"
        ) from None


# notes a library puts before the error itself: SQLAlchemy's for an error inside an autoflush (a read-only sqlite
# store: the database's "attempt to write a readonly database" is the line after it)
PREAMBLES = ("(raised as a result of",)


def first_line(err: BaseException) -> str:
    """The first line of an error's message that says what failed (not a library's preamble), without secrets (a
    store's message can hold its URI); "" if none."""
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    said = [line for line in lines if not line.lstrip().startswith(PREAMBLES)] or lines
    return redact_secrets(said[0]) if said else ""


def set_tags(client: Any, run_ids: list[str], tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(k, v) for k, v in tags.items()]
    for run_id in run_ids:
        for i in range(0, len(items), 100):
            client.log_batch(run_id, tags=items[i : i + 100])


def nested_runs(client: Any, experiment_id: str, run_id: str) -> list[str]:
    """The ids of the runs nested in ``run_id`` (the fine-tuned models of finetune, the variants of compress)."""
    found = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{run_id}'", max_results=1000)
    return [r.info.run_id for r in found]


def end_orphaned_runs(client: Any, experiment_id: str, run_id: str) -> None:
    """Runs nested in the failed stage run ``run_id`` that are still RUNNING end KILLED: a process killed while it
    trained (a model trained side by side, pipeline.training.side_by_side) could not end its own."""
    found = client.search_runs(
        [experiment_id], f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'", max_results=1000
    )
    for run in found:
        client.set_terminated(run.info.run_id, "KILLED")


def log_headline(client: Any, parent: str, paths: Paths, outputs: dict[str, str]) -> None:
    """What a stage wrote for the whole pipeline goes on the parent run too: the run report (artifact
    ``report/index.html``) and the headline (``reports/summary.json``: its numbers as metrics and a
    markdown note that the MLflow UI shows on the run's page). ``outputs``: the stage's ``dvc.out.*`` tags."""
    from mlflow.entities import Metric

    from pipeline.core.io import read_report_if_any
    from pipeline.reporting.headline import headline_markdown, verdict

    def wrote(path: Path) -> bool:
        return f"dvc.out.{path.relative_to(paths.root).as_posix()}" in outputs

    if wrote(paths.run_report):
        client.log_artifact(parent, str(paths.run_report), PARENT_REPORT_DIR)
    if wrote(paths.summary):
        summary = json.loads(paths.summary.read_text(encoding="utf-8"))
        now = int(time.time() * 1000)
        client.log_batch(parent, metrics=[Metric(k, v, now, 0) for k, v in numeric_leaves(summary).items()])
        metrics = read_report_if_any(paths.metrics, EvaluationReport)
        said = verdict(
            metrics,
            read_report_if_any(paths.promotion_report, PromotionReport),
            read_report_if_any(paths.pretrain_report, PretrainReport),
        )
        scored = metrics.summary if metrics else None  # the digits the run report reads (summary.json rounds)
        client.set_tag(parent, "mlflow.note.content", headline_markdown(summary, said, scored))
        client.set_tag(parent, "adaptbert.served", str(summary["served"]))  # adaptbert history lists it


STAGE_RUN_ENV = "ADAPTBERT_STAGE_RUN_ID"  # set for a training process beside others: its stage run's id


def active_run_env(key: str) -> dict[str, str]:
    """``{key: <active stage run id>, MLFLOW_TRACKING_URI: <its store>}`` for a process this one starts; empty when
    nothing is tracked here."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return {}
    return {key: mlflow.active_run().info.run_id, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()}


def child_tracking_env() -> dict[str, str]:
    """Environment for a process that trains beside others (:mod:`pipeline.training.side_by_side`): its nested run
    hangs under the active stage run, in the same store (not ``MLFLOW_RUN_ID``, which would make it that run)."""
    return active_run_env(STAGE_RUN_ENV)


@contextmanager
def nested_run(name: str, params: dict[str, str] | None = None) -> Iterator[str | None]:
    """A run nested in the active stage run (one per fine-tuned model or search trial), with the stage run's
    lineage tags and ``params``; nothing when none is active."""
    mlflow = sys.modules.get("mlflow")
    active = mlflow.active_run() if mlflow is not None else None
    # a process training beside others (pipeline.training.side_by_side) is told its stage run's id instead
    stage_id = active.info.run_id if active is not None else os.environ.get(STAGE_RUN_ENV)
    if mlflow is None or not stage_id:
        yield None
        return
    stage = mlflow.MlflowClient().get_run(stage_id)
    inherited = {
        k: v
        for k, v in stage.data.tags.items()
        if k.startswith(("dvc.", "git.", "data_hash", "adaptbert.stage", "adaptbert.profile"))
    }
    run = mlflow.start_run(
        run_name=name, parent_run_id=stage_id, experiment_id=stage.info.experiment_id, tags=inherited, nested=True
    )
    if params:
        mlflow.log_params(params)
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
    return active_run_env("MLFLOW_RUN_ID")
