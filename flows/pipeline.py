"""``adaptbert-pipeline``: the DVC stages as Prefect tasks, with artifacts; ``compare-and-promote``.

Wiring only: each task has DVC run its stage (:func:`flows.stages.run_dvc_stage`), so DVC decides
what is skipped and owns every output; the ML lives in ``pipeline/``. Stages run in DAG order,
one at a time, under a per-repository lock. The flow opens the MLflow parent run itself and hands
it to the stages (``ADAPTBERT_PARENT_RUN_ID``), so the Prefect run and the MLflow run match.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from flows import stages as st
from flows.notify import notify, promotion_text
from pipeline.core.config import Config, load_config
from pipeline.core.errors import redact_secrets
from pipeline.core.io import read_report_if_any
from pipeline.core.paths import Paths
from pipeline.core.profiles import profile_overrides
from pipeline.core.reports.kinds import TYPED_REPORTS
from pipeline.core.reports.promotion import PromotionReport
from pipeline.core.sections.ray import RayConfig
from pipeline.core.sections.schedule import NotifyConfig
from pipeline.core.stages import NAMES, stage_record
from pipeline.tracking.runs import PARENT_ENV

# The profiles shipped in profiles/: the Prefect UI offers them as choices.
PROFILES = tuple(sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "profiles").glob("*.yaml")))
Profile = Literal[PROFILES]  # type: ignore[valid-type]
Stage = Literal[NAMES]  # type: ignore[valid-type]  (the UI offers the stage names)


def retry_transient_only(task_: Any, task_run: Any, state: Any) -> bool:
    """Retry a stage only when it failed for a transient reason; validation and data failures never retry."""
    try:
        state.result()
    except st.TransientStageFailure:
        return True
    except Exception:
        return False
    return False


def publish_stage_artifacts(stage: str, paths: Paths, parent: str | None = None) -> list[str]:
    """The stage's views (its record in ``pipeline.core.stages``) as keyed artifacts (Artifacts page, with
    history), made from the reports it wrote; returns their keys. ``parent``: this run's MLflow parent run, whose
    artifacts a link view points at (a browser opens an http page from the Prefect UI, never a file:// one)."""
    from pipeline.reporting import views

    keys = []
    for view in stage_record(stage).views if stage in NAMES else ():  # a user's own dvc.yaml stage: no views
        source = getattr(paths, view.source)
        if not source.exists():
            continue
        if view.kind == "link":
            local = source.relative_to(paths.root).as_posix()
            if parent:
                from pipeline.tracking.runs import PARENT_REPORT_DIR, run_page

                link = run_page(paths, parent, f"{PARENT_REPORT_DIR}/{source.name}")
                text = f"{view.source.replace('_', ' ')} in MLflow (also {local} in the project)"
            else:  # no MLflow run (tracking.enabled: false): the file itself
                link, text = source.resolve().as_uri(), f"{view.source.replace('_', ' ')} ({local})"
            create_link_artifact(link, link_text=text, key=view.key, description=view.description)
        else:
            kind = TYPED_REPORTS.get(view.source)  # a typed report is rendered from its model
            report = read_report_if_any(source, kind) if kind else read_report_if_any(source)
            content = getattr(views, str(view.render))(report) if report else None
            if content is None:
                continue
            publish = create_table_artifact if view.kind == "table" else create_markdown_artifact
            publish(content, key=view.key, description=view.description)
        keys.append(view.key)
    return keys


@task(task_run_name="{stage}", retry_condition_fn=retry_transient_only, log_prints=True)
def run_stage(root: str, stage: str, force: bool, timeout_s: int, env: dict[str, str]) -> dict[str, Any]:
    """One DVC stage: ran or skipped (DVC decides), seconds; artifacts from its reports (also when validation fails)."""
    paths = Paths(Path(root))
    env = {**env, **ray_address_env()}
    try:
        result = st.run_dvc_stage(Path(root), stage, force, timeout_s, env)
    except st.ValidationStageFailure:  # bad data (exit code 3): validation's report says what failed
        if stage in NAMES and stage_record(stage).report_failure:
            publish_stage_artifacts(stage, paths, env.get(PARENT_ENV))
        raise
    print(f"{stage}: {'ran' if result['ran'] else 'skipped (unchanged)'} in {result['seconds']} s")
    if result["ran"]:
        publish_stage_artifacts(stage, paths, env.get(PARENT_ENV))
    return {k: result[k] for k in ("stage", "ran", "seconds")}


def ray_address_env() -> dict[str, str]:
    """``RAY_ADDRESS`` of the cluster this task runs on when it runs as a Ray task (:func:`stage_on_ray`), so that
    the stage's own Ray Data work joins that cluster instead of starting one; empty elsewhere (Ray not imported)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    return {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}


@flow(name="adaptbert-stage-on-ray", log_prints=True)
def stage_on_ray(
    root: str, stage: str, force: bool, timeout_s: int, env: dict[str, str], retries: int, retry_delay_s: list[float]
) -> dict[str, Any]:
    """One data stage as a Ray task of this subflow's ``RayTaskRunner`` (``ingest.engine: ray``): it runs on the
    cluster of ``ray.address`` (empty: a local one for the run), and the stage's Ray Data work joins that cluster."""
    from prefect_ray.context import remote_options

    step = run_stage.with_options(retries=retries, retry_delay_seconds=retry_delay_s)
    with remote_options(num_cpus=0):  # the task only waits on `dvc repro`: every CPU stays with the stage's Ray Data
        return step.submit(root, stage, force, timeout_s, env).result()


def ray_task_runner(rc: RayConfig) -> Any:
    """Prefect's Ray task runner for ``ray``: the cluster at ``address``, or a local one of ``num_cpus`` CPUs."""
    from prefect_ray import RayTaskRunner

    local = {"num_cpus": rc.num_cpus, "object_store_memory": rc.object_store_mb and rc.object_store_mb * 2**20}
    init = {} if rc.address else {k: v for k, v in local.items() if v}
    return RayTaskRunner(address=rc.address or None, init_kwargs={**init, "include_dashboard": False})


def open_parent_run(cfg: Config, paths: Paths, flow_run_name: str) -> str | None:
    """An MLflow parent run for this flow run (``None`` with tracking off)."""
    if not cfg.tracking.enabled:
        return None
    from pipeline.tracking import runs as tracking

    client, experiment_id = tracking.connect(cfg.tracking, paths)
    return tracking.create_parent_run(client, experiment_id, cfg, paths, f"prefect {flow_run_name}", "prefect")


def notify_failure(flow_: Any, flow_run: Any, state: Any) -> None:
    """Prefect's failure hook of the pipeline flow: the webhook (``schedule.notify``) hears which run failed, why."""
    repo = Path(flow_run.parameters.get("root", ".")).resolve()
    try:
        nc = load_config(repo / "params.yaml").schedule.notify
    except Exception as err:  # a params.yaml that does not parse may be why the run failed: say so, send nothing
        print(f"notify: no failure notification: params.yaml does not load ({type(err).__name__})", file=sys.stderr)
        return
    notify(nc, "failure", f"adaptbert-pipeline run '{flow_run.name}' failed: {redact_secrets(str(state.message))}")


def notify_promotion(nc: NotifyConfig, paths: Paths) -> None:
    """After the stage that writes the promotion report ran: the webhook hears of a version that became champion."""
    report = read_report_if_any(paths.promotion_report, PromotionReport)
    if report and report.promoted:
        text = promotion_text(report.model_name, report.version, report.reason, report.champion_before)
        notify(nc, "promotion", text)


@flow(name="adaptbert-pipeline", log_prints=True, on_failure=[notify_failure])
def adaptbert_pipeline(
    root: str = ".",
    overrides: dict[str, Any] | None = None,
    force: list[str] | None = None,
    profile: Profile | None = None,  # type: ignore[valid-type]  (a Literal of the files in profiles/)
    until: Stage | None = None,  # type: ignore[valid-type]
) -> list[dict[str, Any]]:
    """Run the DVC stages in DAG order; report which ran and which were skipped.

    Overrides and the profile apply to params.yaml for this run only (the file is restored
    afterwards, also on failure).

    Args:
        root: the project checkout to run in (default: the worker's working directory).
        overrides: params for this run only, as dotted keys, e.g. {"pretrain.max_steps": 200}.
        force: stages to re-run even when DVC finds them unchanged, e.g. ["evaluate"].
        profile: a profile from profiles/ applied on top of params.yaml (biomed, gpu, smoke, zh).
        until: stop after this stage (the stages before it in DAG order run, or are skipped, as usual), e.g. pretrain
            to adapt the encoder and look at it before fine-tuning; default: every stage.
    """
    from prefect.runtime import flow_run

    repo = Path(root).resolve()
    unknown = sorted(set(force or []) - set(NAMES))
    if unknown:
        raise ValueError(f"force: unknown stage(s) {unknown}; stages: {list(NAMES)}")
    if until is not None and until not in NAMES:
        raise ValueError(f"until: unknown stage '{until}'; stages: {list(NAMES)}")
    changes = {**profile_overrides(repo, profile), **(overrides or {})}
    results: list[dict[str, Any]] = []
    with st.repo_lock(repo), st.overridden_params(repo, changes):
        cfg = load_config(repo / "params.yaml")
        parent = open_parent_run(cfg, Paths(repo), flow_run.get_name() or "run")
        env = {PARENT_ENV: parent} if parent else {}
        sc = cfg.schedule
        stages = list(NAMES)[: NAMES.index(until) + 1] if until else list(NAMES)
        try:
            for stage in stages:
                args = (str(repo), stage, stage in (force or []), sc.timeout_for(stage), env)
                if stage_record(stage).on_ray and getattr(cfg, stage).engine == "ray":  # its section's engine
                    on_ray = stage_on_ray.with_options(task_runner=ray_task_runner(cfg.ray))
                    results.append(on_ray(*args, sc.retries, sc.retry_delay_s))
                    continue
                step = run_stage.with_options(retries=sc.retries, retry_delay_seconds=sc.retry_delay_s)
                results.append(step(*args))
                if stage_record(stage).report == "promotion_report" and results[-1]["ran"]:  # the registry's stage
                    notify_promotion(sc.notify, Paths(repo))
        finally:
            outcome = {True: "ran", False: "skipped"}
            summary = [{**r, "ran": outcome[r["ran"]]} for r in results] + [
                {"stage": s, "ran": "failed" if i == 0 else "not reached", "seconds": None}
                for i, s in enumerate(stages[len(results) :])
            ]
            create_table_artifact(
                summary, key="adaptbert-stages", description="which stages ran, which DVC skipped, which failed"
            )
            if parent:
                from mlflow import MlflowClient

                from pipeline.tracking.runs import tracking_uri

                MlflowClient(tracking_uri(Paths(repo))).set_terminated(
                    parent, "FINISHED" if len(results) == len(stages) else "FAILED"
                )
    return results


@flow(name="compare-and-promote", log_prints=True)
def compare_and_promote(
    version: int,
    root: str = ".",
    force: bool = False,
    profile: Profile | None = None,  # type: ignore[valid-type]
) -> dict[str, Any]:
    """Run the promotion gate for a registered version against the champion (from the UI); ``force`` overrides a fail.

    Args:
        version: the registered version to promote (`adaptbert models list` shows them; the MLflow UI too).
        root: the project checkout whose params.yaml holds the gate's rules (register) and the tracking settings.
        force: move champion even when the gate fails (the version is tagged promotion.forced: true).
        profile: promote within that profile's registered model (<model_name>-<profile>), as its runs register.
    """
    from pipeline.reporting.views import manual_promotion_markdown
    from pipeline.tracking import promotion
    from pipeline.tracking.gate import Rules
    from pipeline.tracking.runs import connect

    repo = Path(root).resolve()
    cfg = load_config(repo / "params.yaml", profile_overrides(repo, profile))
    client, _ = connect(cfg.tracking, Paths(repo))
    name = cfg.registration.model_name
    decision = promotion.promote(client, name, str(version), Rules.from_config(cfg.registration), force=force)
    promotion.record_verdict(client, name, decision)
    v = decision.verdict
    if decision.promoted:
        text = promotion_text(name, str(version), v.reason, decision.previous_champion, decision.forced)
        notify(cfg.schedule.notify, "promotion", text)
    rows = [{k: r[k] for k in ("metric", "challenger", "champion", "delta", "check", "ok")} for r in v.rows]
    said = manual_promotion_markdown(
        name,
        str(version),
        decision.promoted,
        v.reason,
        decision.previous_champion,
        decision.champion_after,
        decision.forced,
    )
    create_markdown_artifact(said, key="adaptbert-manual-promotion")
    if rows:
        create_table_artifact(rows, key="adaptbert-manual-promotion-table")
    print(v.reason)
    return {"version": version, "promoted": decision.promoted, "champion": decision.champion_after, "reason": v.reason}
