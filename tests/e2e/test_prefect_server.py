"""The flow against a real `prefect server`: served deployment, triggered runs, artifacts, a failing run (slow)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pipeline.core.io import read_report
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.stages import NAMES as PIPELINE_STAGES
from tests.conftest import ROOT, free_port, make_repo, stop, wait_for_http, webhook_receiver

pytestmark = pytest.mark.slow
STAGES = list(PIPELINE_STAGES)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`prefect server start` on a free port with its own PREFECT_HOME; shut down after the module."""
    home = tmp_path_factory.mktemp("prefect_home")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the served runner looks for triggered runs every second (default 10: ~10 s idle per triggered run here)
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    }
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/api/health", proc, log, seconds=240)
        yield {**env, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    finally:
        stop(proc)


def _serve(repo: Path, env: dict[str, str], since: float = 0.0) -> subprocess.Popen:
    """Start `python -m flows.serve` for ``repo`` (its own process group) and wait until both its deployments are
    (re)registered (`serve` registers them one after the other: CI once read the second before it was there)."""
    log = repo.parent / "serve.log"
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.serve", "--root", str(repo), "--profile", "smoke"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while True:
        deployment = _deployment(env, "adaptbert-pipeline/scheduled")
        manual = _deployment(env, "compare-and-promote/manual")
        if (
            deployment is not None
            and deployment.parameters.get("root") == str(repo)
            and deployment.updated.timestamp() > since
            and manual is not None
            and manual.updated.timestamp() > since
        ):
            return proc
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)


def _kill_everything_of(proc: subprocess.Popen, repo: Path) -> None:
    """SIGKILL the serving process, its flow run, and every process working in ``repo`` (dvc, the stage)."""
    import psutil

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for p in psutil.process_iter(["cwd"]):
        try:
            if p.info["cwd"] and Path(p.info["cwd"]).is_relative_to(repo):
                p.kill()
        except psutil.Error:
            continue


@pytest.fixture(scope="module")
def webhook() -> Iterator[tuple[str, list[dict]]]:
    """A webhook receiver on 127.0.0.1 the served flows notify (schedule.notify: ADAPTBERT_WEBHOOK_URL)."""
    with webhook_receiver() as hook:
        yield hook


@pytest.fixture(scope="module")
def served(
    prefect_server: dict[str, str], webhook: tuple[str, list[dict]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """`python -m flows.serve` of a fresh project repository (smoke profile) against that server, its flows
    notifying the webhook."""
    repo = make_repo(tmp_path_factory.mktemp("prefect_repo"))
    proc = _serve(repo, {**prefect_server, "ADAPTBERT_WEBHOOK_URL": webhook[0]})
    try:
        yield repo
    finally:
        stop(proc)


def _client(env: dict[str, str]):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class Session:
        def __enter__(self):
            self._settings = temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]})
            self._settings.__enter__()
            self._client = get_client(sync_client=True)
            return self._client.__enter__()

        def __exit__(self, *exc):
            self._client.__exit__(*exc)
            self._settings.__exit__(*exc)

    return Session()


def _deployment(env: dict[str, str], name: str):
    from prefect.exceptions import ObjectNotFound

    with _client(env) as client:
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            return None


def _trigger(env: dict[str, str], name: str, parameters: dict | None = None, timeout: float = 900) -> tuple:
    """Trigger a run of deployment ``name`` through the API; wait for a final state; return (state name, artifacts by key)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        run = run_deployment(name, parameters=parameters or {}, timeout=0, as_subflow=False)
    deadline = time.monotonic() + timeout
    with _client(env) as client:
        while True:
            state = client.read_flow_run(run.id).state
            if state is not None and state.is_final():
                break
            assert time.monotonic() < deadline, f"flow run {run.id} still {state.name if state else None}"
            time.sleep(0.5)
        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    return state.name, {a.key: a for a in artifacts if a.key}


def _table(artifact) -> list[dict]:
    data = artifact.data
    return json.loads(data) if isinstance(data, str) else data


def test_the_served_deployment_has_the_cron_schedule(served: Path, prefect_server: dict[str, str]) -> None:
    deployment = _deployment(prefect_server, "adaptbert-pipeline/scheduled")
    assert [(s.schedule.cron, s.schedule.timezone) for s in deployment.schedules] == [("0 3 * * 1", "UTC")]
    assert deployment.parameters["profile"] == "smoke"
    assert _deployment(prefect_server, "compare-and-promote/manual") is not None


# The compressed variants are built, timed and registered under `dvc repro` (test_dvc_pipeline.py); here the
# compress stage runs disabled (the run is about orchestration: ~45 s less of CI)
NO_VARIANTS = {"overrides": {"compress.enabled": False}}


def test_triggered_runs_complete_then_skip_everything(
    served: Path, prefect_server: dict[str, str], webhook: tuple[str, list[dict]]
) -> None:
    params_before = (served / "params.yaml").read_bytes()
    state, artifacts = _trigger(prefect_server, "adaptbert-pipeline/scheduled", NO_VARIANTS)
    assert state == "Completed", (served.parent / "serve.log").read_text()[-5000:]
    assert {
        "adaptbert-stages",
        "adaptbert-validation",
        "adaptbert-ingest",
        "adaptbert-tokenize",
        "adaptbert-metrics",
        "adaptbert-dapt-vs-baseline",
        "adaptbert-verdict",
        "adaptbert-promotion",
        "adaptbert-run-report",
    } <= set(artifacts)
    # a link a browser opens from the Prefect UI (was file://): the parent run's report in MLflow's artifact view
    link = artifacts["adaptbert-run-report"].data
    assert "http://127.0.0.1:5000/#/experiments/" in link and "/artifactPath/report/index.html" in link
    assert [(r["stage"], r["ran"]) for r in _table(artifacts["adaptbert-stages"])] == [(s, "ran") for s in STAGES]
    assert "# Validation: passed" in artifacts["adaptbert-validation"].data
    assert "MLflow run:" in artifacts["adaptbert-promotion"].data
    assert {r["task"] for r in _table(artifacts["adaptbert-dapt-vs-baseline"])} == {"role", "pair", "ner", "qa", "mean"}
    assert (served / "params.yaml").read_bytes() == params_before  # the smoke profile applied for the run only
    assert (served / "models" / "finetuned" / "heads.safetensors").exists()
    _assert_the_smoke_run_stayed_out_of_the_real_registry(served)
    # the webhook hears of v1 only if the gate made it the champion (a smoke model may miss the floors)
    gate_passed = json.loads((served / "reports" / "promotion.json").read_text())["promoted"]
    promoted = [m for m in webhook[1] if m["event"] == "promotion"]
    assert len(promoted) == int(gate_passed), webhook[1]

    state, artifacts = _trigger(prefect_server, "adaptbert-pipeline/scheduled", NO_VARIANTS)
    assert state == "Completed"
    assert [(r["stage"], r["ran"]) for r in _table(artifacts["adaptbert-stages"])] == [(s, "skipped") for s in STAGES]
    assert "adaptbert-validation" not in artifacts  # nothing ran, nothing new to show

    state, artifacts = _trigger(prefect_server, "compare-and-promote/manual", {"version": 1, "force": True})
    assert state == "Completed" and "adaptbert-manual-promotion" in artifacts
    # v1 is the champion now, once: by the gate in the pipeline run, or forced here; the webhook heard it once
    promoted = [m for m in webhook[1] if m["event"] == "promotion"]
    assert len(promoted) == 1 and promoted[0]["text"].startswith("adaptbert-smoke v1 is the champion"), webhook[1]
    assert gate_passed or "(forced past the gate)" in promoted[0]["text"]


def _assert_the_smoke_run_stayed_out_of_the_real_registry(repo: Path) -> None:
    """Was: one smoke run added five junk versions to `adaptbert` and moved `@challenger` onto one of them."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    assert [m.name for m in client.search_registered_models()] == ["adaptbert-smoke"]
    assert client.get_experiment_by_name("adaptbert") is None
    runs = client.search_runs([client.get_experiment_by_name("adaptbert-smoke").experiment_id], max_results=100)
    assert len(runs) >= 13 and {r.data.tags.get("adaptbert.profile") for r in runs} == {"smoke"}
    versions = client.search_model_versions("name = 'adaptbert-smoke'")
    assert versions and {v.tags.get("profile") for v in versions} == {"smoke"}
    listed = subprocess.run(  # the registry CLI reaches the profile's model with --profile
        [sys.executable, "-m", "pipeline", "--root", str(repo), "models", "list", "--profile", "smoke", "--json"],
        cwd=repo,
        env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["version"] for r in json.loads(listed.stdout)) == sorted(str(v.version) for v in versions)
    report = json.loads((repo / "reports" / "promotion.json").read_text())
    assert (report["profile"], report["model_name"]) == ("smoke", "adaptbert-smoke")


def test_a_corrupted_task_file_fails_the_run_with_the_validation_artifact(
    served: Path, prefect_server: dict[str, str], webhook: tuple[str, list[dict]]
) -> None:
    raw = served / "data" / "raw" / "role"
    shutil.copytree(served / "data" / "demo" / "tasks" / "role", raw)
    params = yaml.safe_load((served / "params.yaml").read_text())
    role = next(t for t in params["ingest"]["tasks"] if t["name"] == "role")
    role["files"] = {s: f"data/raw/role/{s}.csv" for s in ("train", "validation", "test")}
    (served / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    test_csv = raw / "test.csv"
    lines = test_csv.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0] + ",DISCUSSION"  # line 5 of the file
    test_csv.write_text("\n".join(lines) + "\n")
    state, artifacts = _trigger(prefect_server, "adaptbert-pipeline/scheduled")
    assert state == "Failed"
    summary = artifacts["adaptbert-validation"].data
    assert (
        summary.startswith("# Validation: FAILED")
        and "labels within the label set" in summary
        and "data/raw/role/test.csv:5" in summary
    )
    ran = {r["stage"]: r["ran"] for r in _table(artifacts["adaptbert-stages"])}
    assert ran["ingest"] == "ran" and ran["validate"] == "failed" and ran["register"] == "not reached"
    # the webhook heard which run failed, and why: the flow's on_failure hook posts after the run's state is Failed,
    # so the message may land a moment after _trigger saw that state (CI once asserted before it arrived)
    deadline = time.monotonic() + 60
    while not (failed := [m for m in webhook[1] if m["event"] == "failure"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(failed) == 1 and "adaptbert-pipeline run" in failed[0]["text"] and "validate" in failed[0]["text"]


def test_killed_while_pretraining_a_new_run_resumes_and_reruns_nothing_done(
    prefect_server: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # no MLflow: nothing here reads it (the triggered test does), and each of the seven stage processes would
    # import it for a run nobody reads (~3 s each)
    repo = make_repo(tmp_path_factory.mktemp("prefect_kill_repo"), **{"tracking.enabled": False})
    params_before = (repo / "params.yaml").read_bytes()
    # up to pretrain only (`until`): what comes after it is the triggered test's. The kill lands at the third
    # checkpoint (step 15), 85 steps before the end (~0.1-0.25 s a step of the tiny model, a checkpoint every 5)
    long_pretrain = {
        "overrides": {"pretrain.max_steps": 100, "pretrain.eval_steps": 100, "pretrain.save_steps": 5},
        "until": "pretrain",
    }
    proc = _serve(repo, prefect_server)
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server["PREFECT_API_URL"]}):
        run_deployment("adaptbert-pipeline/scheduled", parameters=long_pretrain, timeout=0, as_subflow=False)
    checkpoints = repo / "checkpoints" / "pretrain"
    deadline = time.monotonic() + 600
    while len(list(checkpoints.glob("checkpoint-*"))) < 3:  # two complete checkpoints at least
        assert time.monotonic() < deadline, (repo.parent / "serve.log").read_text()[-3000:]
        time.sleep(0.5)
    killed_at = time.time()
    _kill_everything_of(proc, repo)
    assert not (repo / "models" / "dapt").exists()
    assert (repo / "params.yaml").read_bytes() != params_before  # the killed run's overrides are still applied ...

    proc = _serve(repo, prefect_server, since=killed_at)
    try:
        state, artifacts = _trigger(prefect_server, "adaptbert-pipeline/scheduled", long_pretrain)
    finally:
        stop(proc)
    assert state == "Completed", (repo.parent / "serve.log").read_text()[-5000:]
    ran = {r["stage"]: r["ran"] for r in _table(artifacts["adaptbert-stages"])}
    assert list(ran) == STAGES[: STAGES.index("pretrain") + 1]  # until: the run ends after pretrain
    assert [ran[s] for s in ("demo", "ingest", "validate", "tokenize")] == ["skipped"] * 4  # done before the kill
    assert ran["pretrain"] == "ran"
    report = read_report(repo / "reports" / "pretrain.json", PretrainReport)  # with its measured half
    assert report.resumed_from is not None and int(report.resumed_from.split("-")[1]) >= 5 and report.global_step == 100
    assert (repo / "params.yaml").read_bytes() == params_before  # ... and the user's file is back


def test_with_the_ray_engines_ingest_and_tokenize_run_as_ray_tasks_and_join_that_cluster(
    prefect_server: dict[str, str], tmp_path: Path
) -> None:
    """``ingest.engine`` and ``tokenize.engine: ray``: the flow runs each of them in a subflow whose task runner is
    Prefect's ``RayTaskRunner`` (a local Ray here, ``ray.address`` empty); the stage's Ray work joins that cluster
    rather than starting one; validate, between them, runs as a plain task."""
    # the small demo sizes and no MLflow: the test is about where the stages run (4 stage processes, ~3 s each
    # importing MLflow, and a 2,000-document demo corpus through Ray were CI minutes that proved nothing more)
    repo = make_repo(tmp_path / "repo", **{"tracking.enabled": False})
    code = (
        "import json, sys\nfrom flows.pipeline import adaptbert_pipeline\n"
        "overrides = {'ingest.engine': 'ray', 'tokenize.engine': 'ray', 'ray.num_cpus': 2}\n"
        "print(json.dumps(adaptbert_pipeline(root=sys.argv[1], until='tokenize', overrides=overrides)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(repo)],
        cwd=ROOT,
        env=prefect_server,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = json.loads([line for line in done.stdout.splitlines() if line.startswith("[")][-1])
    ran = [("demo", True), ("ingest", True), ("validate", True), ("tokenize", True)]
    assert [(r["stage"], r["ran"]) for r in results] == ran
    for stage in ("ingest", "tokenize"):
        report = json.loads((repo / "reports" / f"{stage}.json").read_text())
        assert report["engine"] == "ray" and report["engine_cluster"] == {"joined": True, "cpus": 2}, stage
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with _client(prefect_server) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["adaptbert-stage-on-ray"])))
        assert [r.state_name for r in runs] == ["Completed", "Completed"]
        tasks = sorted(t.name for t in client.read_task_runs() if t.flow_run_id in {r.id for r in runs})
        assert tasks == ["ingest", "tokenize"]
