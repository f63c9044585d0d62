"""A team's stack (issue 65): the pipeline against MLflow on PostgreSQL with artifacts in S3, DVC's remote in S3,
Prefect on PostgreSQL with a worker on the work pool; all of it started once by ``tools.team_stack`` (marked slow)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_FINETUNE, TINY_PRETRAIN, make_repo, needs_environment, write_params
from tools import team_stack

pytestmark = [
    pytest.mark.slow,
    needs_environment(
        bool(shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))),
        "PostgreSQL (initdb, pg_ctl) is not installed",
    ),
]
MODEL = "adaptbert"  # the repository's registered model (params.yaml register.model_name)
# the tiny model's gate: no floor against the trivial baseline, so the first version becomes champion
GATE = {"register.min_gain_over_trivial": -1.0, "register.max_regression": 1.0, "register.min_delta": 0.005}


def _sh(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    # PWD as a shell has it: prefect.yaml's pull step reads it (`{{ $PWD }}`) as the project's folder
    env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PWD": str(cwd)}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[team_stack.Stack]:
    """PostgreSQL, the S3 endpoint, MLflow and Prefect servers and a worker, up for this module."""
    running = team_stack.up(tmp_path_factory.mktemp("team") / "stack")
    try:
        yield running
    finally:
        team_stack.down(running)


@pytest.fixture(scope="module")
def env(stack: team_stack.Stack) -> dict[str, str]:
    """A user's environment after ``. env.sh``: the servers' URLs and the S3 keys, nothing of this machine's MLflow."""
    return {**team_stack.base_env(), **stack.client_env(), "PREFECT_HOME": str(stack.folder / "client-prefect")}


@pytest.fixture(scope="module")
def repo(stack: team_stack.Stack, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new project whose DVC remote is the team bucket, its pipeline run once against the team's servers."""
    repo = make_repo(
        tmp_path_factory.mktemp("team-repo"),
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        **GATE,
        **{"tracking.enabled": True, "compress.variants": ["int8"], "compress.latency.requests": 4},
    )
    _sh(["dvc", "remote", "add", "-f", "-d", "team", stack.dvc_remote], repo, env)
    _sh(["dvc", "remote", "modify", "team", "endpointurl", stack.s3_endpoint], repo, env)
    _sh(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "team remote"], repo, env)
    run = _sh(["dvc", "repro"], repo, env)
    (repo.parent / "repro-output.txt").write_text(run.stdout + run.stderr, encoding="utf-8")
    return repo


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _query(stack: team_stack.Stack, sql: str) -> list[tuple]:
    conn = team_stack.connect(stack, "mlflow")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _bucket_keys(stack: team_stack.Stack, bucket: str) -> list[str]:
    pages = team_stack.s3_client(stack).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def test_runs_versions_and_artifacts_are_in_postgres_and_the_bucket(stack: team_stack.Stack, repo: Path) -> None:
    (parents,) = _query(
        stack, "SELECT count(*) FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid WHERE t.key = 'mlflow.parentRunId'"
    )
    assert parents[0] >= 6  # a child run per stage, under the one parent of `dvc repro`
    versions = _query(stack, f"SELECT version, source FROM model_versions WHERE name = '{MODEL}'")
    assert versions and all(source.startswith(("models:/", "mlflow-artifacts:")) for _, source in versions), versions
    aliases = dict(_query(stack, f"SELECT alias, version FROM registered_model_aliases WHERE name = '{MODEL}'"))
    promotion = json.loads((repo / "reports" / "promotion.json").read_text())
    assert str(aliases["challenger"]) == str(aliases["champion"]) == promotion["version"], (aliases, promotion)
    keys = _bucket_keys(stack, team_stack.MLFLOW_BUCKET)
    assert any(k.endswith("/MLmodel") for k in keys) and any(k.endswith("/index.html") for k in keys), keys
    # nothing went to the embedded defaults
    assert not (repo / "mlflow.db").exists() and not (repo / "mlartifacts").exists()


def test_dvc_push_then_pull_into_a_fresh_clone_restores_the_outputs(
    stack: team_stack.Stack, repo: Path, env: dict[str, str], tmp_path: Path
) -> None:
    _sh(["git", "add", "-A"], repo, env)  # the run as a user commits it: dvc.lock names what `dvc pull` fetches
    _sh(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "run"], repo, env)
    _sh(["dvc", "push"], repo, env)
    assert _bucket_keys(stack, team_stack.DVC_BUCKET)
    clone = tmp_path / "clone"
    _sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    _sh(["dvc", "pull"], clone, env)
    for out in ("models/finetuned/heads.safetensors", "models/dapt/model.safetensors", "data/corpus/manifest.json"):
        assert _md5(clone / out) == _md5(repo / out), out
    # nothing retrains in the clone (was: adapt, pretrain, finetune and compress, for want of their checkpoints);
    # register runs: reports/promotion.json is the receipt of a workspace's registry, in neither git nor DVC's cache
    status = _sh(["dvc", "status", "dvc.yaml"], clone, env).stdout
    changed = {line[:-1] for line in status.splitlines() if line.endswith(":") and not line[0].isspace()}
    assert changed == {"register", "report"}, status[-2000:]


def test_the_champion_is_served_from_the_bucket(stack: team_stack.Stack, repo: Path, env: dict[str, str]) -> None:
    text = "Patients were randomised to the study drug or placebo."
    predict = _sh(
        [sys.executable, "-m", "pipeline", "--root", str(repo), "predict", "role", "--text", text],
        ROOT,
        env,
    )
    answer = json.loads(predict.stdout.strip().splitlines()[-1])
    assert answer["model"] == MODEL and answer["version"] and answer["variant"], answer
    assert set(answer) - {"model", "version", "variant", "task"}, answer  # and an answer beside the names


def test_no_secret_reaches_an_output_a_log_or_mlflow(stack: team_stack.Stack, repo: Path) -> None:
    from mlflow import MlflowClient

    secrets = set(stack.secrets().values())
    assert len(secrets) == 3 and all(len(s) >= 18 for s in secrets)  # the database password and the two S3 keys
    leaks = []
    for path in [repo.parent / "repro-output.txt", *repo.rglob("*")]:
        if path.is_file() and ".git" not in path.parts and path.stat().st_size < 50_000_000:
            data = path.read_bytes()
            leaks += [str(path) for s in secrets if s.encode() in data]
    s3 = team_stack.s3_client(stack)
    for key in _bucket_keys(stack, team_stack.MLFLOW_BUCKET):  # what MLflow holds: reports, cards, models
        data = s3.get_object(Bucket=team_stack.MLFLOW_BUCKET, Key=key)["Body"].read()
        leaks += [f"s3://{team_stack.MLFLOW_BUCKET}/{key}" for s in secrets if s.encode() in data]
    client = MlflowClient(stack.mlflow_uri)
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        blob = json.dumps([run.data.params, run.data.tags])
        leaks += [f"run {run.info.run_id}" for s in secrets if s in blob]
    for version in client.search_model_versions(f"name = '{MODEL}'"):
        leaks += [f"version {version.version}" for s in secrets if s in json.dumps([version.tags, version.description])]
    assert not leaks, leaks


def test_the_worker_runs_a_flow_run_from_the_work_pool(
    stack: team_stack.Stack, repo: Path, env: dict[str, str]
) -> None:
    """`prefect deploy` from the project (prefect.yaml), a run of the scheduled deployment, picked up by the worker."""
    _sh([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "scheduled"], repo, env)
    run = _sh(
        [
            sys.executable,
            "-m",
            "prefect",
            "deployment",
            "run",
            "adaptbert-pipeline/scheduled",
            "--watch",
            "--watch-timeout",
            "600",
        ],
        repo,
        env,
        check=False,
    )
    assert run.returncode == 0 and "Completed" in run.stdout, (run.stdout + run.stderr)[-3000:]
    worker_log = (stack.folder / "logs" / "worker.log").read_text(encoding="utf-8")
    assert "adaptbert-pipeline" in worker_log or "Completed" in worker_log, worker_log[-2000:]


def test_two_pipelines_registering_at_once_lose_no_version_and_move_champion_once(
    stack: team_stack.Stack, repo: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """Two machines (their own temp folders: no shared file lock) register the same model under a new name."""
    name = "adaptbert-race"
    procs = []
    for i in range(2):
        clone = tmp_path / f"machine{i}"
        shutil.copytree(repo, clone, symlinks=True)
        (tmp_path / f"tmp{i}").mkdir()
        params = write_params(
            clone / "params-race.yaml", **TINY_PRETRAIN, **TINY_FINETUNE, **GATE, **{"register.model_name": name}
        )
        cmd = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(clone), "register"]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**env, "TMPDIR": str(tmp_path / f"tmp{i}")},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    reports = [json.loads((tmp_path / f"machine{i}" / "reports" / "promotion.json").read_text()) for i in range(2)]
    from mlflow import MlflowClient

    client = MlflowClient(stack.mlflow_uri)
    registered = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
    made = sorted(int(v) for r in reports for v in r["versions"].values())  # each: the full model and its variant
    assert registered == made == list(range(1, len(made) + 1)) and len(made) == 4, (registered, made)
    assert sum(r["promoted"] for r in reports) == 1, reports  # the second, no better, does not move it again
    champion = client.get_registered_model(name).aliases["champion"]
    assert champion == next(r["version"] for r in reports if r["promoted"])


def test_a_tracking_server_restarted_mid_stage_is_retried_and_the_stage_succeeds(
    stack: team_stack.Stack, repo: Path, env: dict[str, str]
) -> None:
    """The server is down when the stage starts and comes back ~10 s later: the bounded retries bridge it."""
    team_stack.kill_group(stack.pids.pop("mlflow"))
    cmd = [sys.executable, "-m", "pipeline", "--root", str(repo), "evaluate"]
    stage = subprocess.Popen(
        [*cmd],
        cwd=ROOT,
        env={**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    restarter = threading.Timer(10, team_stack.restart, (stack, "mlflow"))
    restarter.start()
    out, err = stage.communicate(timeout=600)
    restarter.join()
    assert stage.returncode == 0, (out + err)[-3000:]
    from mlflow import MlflowClient

    runs = MlflowClient(stack.mlflow_uri).search_runs(
        [e.experiment_id for e in MlflowClient(stack.mlflow_uri).search_experiments()],
        filter_string="tags.`adaptbert.stage` = 'evaluate'",
        order_by=["attributes.start_time DESC"],
    )
    assert runs and runs[0].info.status == "FINISHED" and runs[0].info.start_time > (time.time() - 900) * 1000


def test_a_remote_whose_bucket_is_missing_fails_the_push_and_creates_nothing(
    stack: team_stack.Stack, repo: Path, env: dict[str, str]
) -> None:
    _sh(["dvc", "remote", "add", "-f", "gone", "s3://adaptbert-no-such-bucket/store"], repo, env)
    _sh(["dvc", "remote", "modify", "gone", "endpointurl", stack.s3_endpoint], repo, env)
    push = _sh(["dvc", "push", "-r", "gone"], repo, env, check=False)
    # DVC's own message says what is wrong (S3's NoSuchBucket) but not which bucket: `dvc remote list` does
    assert push.returncode != 0 and "bucket does not exist" in push.stderr, push.stderr
    assert "Traceback" not in push.stderr
    assert "adaptbert-no-such-bucket" not in [b["Name"] for b in team_stack.s3_client(stack).list_buckets()["Buckets"]]


def test_an_artifact_store_that_refuses_fails_register_clearly_and_moves_no_alias(
    stack: team_stack.Stack, repo: Path, env: dict[str, str]
) -> None:
    """The bucket behind the tracking server is gone: register fails with one clear line, no alias moves."""
    s3 = team_stack.s3_client(stack)
    keys = _bucket_keys(stack, team_stack.MLFLOW_BUCKET)
    for start in range(0, len(keys), 1000):
        s3.delete_objects(
            Bucket=team_stack.MLFLOW_BUCKET, Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]]}
        )
    s3.delete_bucket(Bucket=team_stack.MLFLOW_BUCKET)
    try:
        name = "adaptbert-refused"
        params = write_params(
            repo / "params-refused.yaml", **TINY_PRETRAIN, **TINY_FINETUNE, **GATE, **{"register.model_name": name}
        )
        cmd = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(repo), "register"]
        proc = _sh(cmd, ROOT, {**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}, check=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert stack.mlflow_uri in last and "artifact store refused" in last, last  # not the SQLite advice
        from mlflow import MlflowClient

        client = MlflowClient(stack.mlflow_uri)
        models = {m.name: m for m in client.search_registered_models()}
        assert name not in models or not models[name].aliases, models.get(name)
    finally:
        s3.create_bucket(Bucket=team_stack.MLFLOW_BUCKET)
