"""MLflow tracking: parent/child runs, params, metrics, artifacts, lineage, and a clear error when the server is away."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.paths import Paths
from pipeline.tracking import lineage
from pipeline.tracking import runs as tracking
from pipeline.tracking.datasets import SPLITS
from pipeline.tracking.lineage import file_md5
from tests.conftest import ROOT, free_port, make_config, write_params


def test_flatten_params_and_metrics() -> None:
    assert tracking.flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": "x"}) == {"a.b": 1, "a.c.d": [1, 2], "e": "x"}
    assert tracking.numeric_leaves({"n": 3, "ok": True, "s": "x", "f(1)": 0.5, "d": {"g": 2.0}}) == {
        "n": 3.0,
        "f_1_": 0.5,
        "d.g": 2.0,
    }
    params = tracking.as_params(make_config(**{"pretrain.max_steps": 77}), ("pretrain", "seed", "tokenize.doc_stride"))
    assert params["pretrain.max_steps"] == "77" and params["seed"] == str(make_config().seed)
    assert params["tokenize.doc_stride"] == str(make_config().tokenize.doc_stride)
    assert not any(k.startswith("finetune.") for k in params) and "tokenize.max_seq_length" not in params
    assert tracking.stage_params(ROOT, "register") == (
        "register",
        "pretrain.base_model",
        "seed",
        "tokenize.max_seq_length",
        "tokenize.doc_stride",
        "evaluate.batch_size",
        "precision",
    )
    full = tracking.as_params(make_config())
    assert json.loads(full["tokenize.extend_vocab.enabled"].lower()) is True and "register.model_name" in full
    # a password in a URI-capable setting never reaches MLflow (was: every run logged ray.address as it was)
    secret = tracking.as_params(make_config(**{"ray.address": "ray://alice:pw-7@10.0.0.5:10001"}), ("ray",))
    assert secret["ray.address"] == "ray://10.0.0.5:10001" and "pw-7" not in json.dumps(secret)


def test_lineage_reads_git_and_dvc_lock(tmp_path: Path) -> None:
    assert lineage.git_state(tmp_path) == {"git.commit": "unknown", "git.dirty": "unknown"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  ingest:\n    cmd: x\n    outs:\n    - path: data/corpus\n"
        "      hash: md5\n      md5: abc.dir\n    - path: data/tasks\n      hash: md5\n      md5: def.dir\n"
    )
    (tmp_path / "params.yaml").write_text("seed: 1\n")
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "dvc.lock", "params.yaml"], cwd=tmp_path, check=True
    )
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"], cwd=tmp_path, check=True)
    tags = lineage.lineage_tags(Paths(tmp_path))
    assert len(tags["git.commit"]) == 40 and tags["git.dirty"] == "false"
    assert tags["dvc.ingest.data/corpus"] == "abc.dir" and tags["dvc.ingest.data/tasks"] == "def.dir"
    assert len(tags["data_hash"]) == 32
    (tmp_path / "dvc.lock").write_text((tmp_path / "dvc.lock").read_text().replace("abc.dir", "xyz.dir"))
    changed = lineage.lineage_tags(Paths(tmp_path))
    assert (
        changed["git.dirty"] == "false" and changed["data_hash"] != tags["data_hash"]
    )  # outputs changed: a run, not an edit
    (tmp_path / "params.yaml").write_text("seed: 2\n")
    assert lineage.lineage_tags(Paths(tmp_path))["git.dirty"] == "true"  # params edited but not committed


def test_stage_io_hashes_equal_what_dvc_records(tmp_path: Path) -> None:
    """``dvc.in.*`` / ``dvc.out.*`` tags must equal dvc.lock: the same md5 as DVC for a file and a directory."""
    import yaml

    (tmp_path / "data" / "sub" / "__pycache__").mkdir(parents=True)
    (tmp_path / "data" / "a.txt").write_text("alpha\n")
    (tmp_path / "data" / "sub" / "b.bin").write_bytes(bytes(range(256)) * 5000)  # > 1 MiB chunk
    (tmp_path / "data" / "sub" / "__pycache__" / "x.pyc").write_bytes(b"ignored by .dvcignore")
    (tmp_path / "notes.md").write_text("crlf\r\nline\n")
    (tmp_path / ".dvcignore").write_text("__pycache__/\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, env=env)
    subprocess.run(["dvc", "add", "-q", "data", "notes.md"], cwd=tmp_path, check=True, env=env)
    for name in ("data", "notes.md"):
        recorded = yaml.safe_load((tmp_path / f"{name}.dvc").read_text())["outs"][0]["md5"]
        assert lineage.dvc_md5(tmp_path / name) == recorded, name
    assert lineage.dvc_md5(tmp_path / "missing") is None


def test_stage_paths_read_deps_and_every_kind_of_out() -> None:
    deps, outs = lineage.stage_paths(ROOT, "evaluate")
    assert "pipeline/stages/evaluate.py" in deps and "models/finetuned" in deps
    assert {"reports/metrics.json", "reports/evaluation.md", "reports/plots"} <= set(outs)
    # an uncached out and a metrics file
    assert lineage.stage_paths(ROOT, "register")[1] == ["reports/promotion.json", "reports/summary.json"]


def _runs(paths: Paths) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking.tracking_uri(paths))
    exp = client.get_experiment_by_name("adaptbert")
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def test_stage_runs_nest_under_one_parent_and_failures_are_marked(project, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    _, paths = project
    cfg = make_config(**{"tracking.enabled": True})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client, exp_id = tracking.connect(cfg.tracking, paths)
    parent = client.create_run(exp_id, run_name="pipeline (test)").info.run_id
    monkeypatch.setenv(tracking.PARENT_ENV, parent)
    with tracking.stage_run(cfg, paths, "ingest") as run_id:
        assert run_id is not None
    with pytest.raises(RuntimeError, match="boom"), tracking.stage_run(cfg, paths, "validate"):
        paths.validation_report.write_text('{"success": false}')  # validate writes its report, then fails
        raise RuntimeError("boom")
    runs = {r.info.run_name: r for r in _runs(paths)}
    ingest, validate = runs["ingest"], runs["validate"]
    assert ingest.data.tags["mlflow.parentRunId"] == parent == validate.data.tags["mlflow.parentRunId"]
    assert (
        ingest.info.status == "FINISHED" and validate.info.status == "FAILED" and validate.data.tags["error"] == "boom"
    )
    assert ingest.data.params["ingest.corpus.min_chars"] == "50" and "pretrain.max_steps" not in ingest.data.params
    report = json.loads(paths.ingest_report.read_text())
    assert ingest.data.metrics["corpus.documents_read"] == report["corpus"]["documents_read"]
    assert [a.path for a in MlflowClient().list_artifacts(ingest.info.run_id)] == ["ingest.json"]
    assert "validation.json" in [a.path for a in MlflowClient().list_artifacts(validate.info.run_id)]  # why it failed
    assert client.get_run(parent).info.status == "FAILED"
    # what ingest wrote is the run's dataset inputs (MLflow's Dataset column): the corpus splits and every task split
    inputs = {d.dataset.name: d for d in ingest.inputs.dataset_inputs}
    tasks = sorted(p.parent.name for p in paths.tasks.glob("*/task.json"))
    assert set(inputs) == {"corpus/train", "corpus/validation"} | {f"{t}/{s}" for t in tasks for s in SPLITS}
    ner_test = inputs["ner/test"]
    assert ner_test.dataset.digest == file_md5(paths.tasks / "ner" / "test.parquet")[:8]
    assert [(t.key, t.value) for t in ner_test.tags] == [("mlflow.data.context", "test")]
    assert str((paths.tasks / "ner" / "test.parquet").resolve()) in ner_test.dataset.source
    assert validate.inputs.dataset_inputs == []  # a failed stage logs none


def test_listing_a_stages_datasets_prints_no_mlflow_warning(project, recwarn: pytest.WarningsRecorder) -> None:
    """MLflow 3 warned "can be interpreted in multiple ways: LocalArtifactDatasetSource, LocalArtifactDatasetSource"
    (one class, registered twice) for every file, into every stage's console."""
    from pipeline.tracking.datasets import dataset_inputs

    _, paths = project
    assert len(dataset_inputs("ingest", paths)) > 2
    assert not [w for w in recwarn if "interpreted in multiple ways" in str(w.message)]


def test_a_failed_stage_ends_the_runs_its_killed_processes_left_running(
    project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model trained in a process of its own (finetune side by side) that is killed cannot end its nested run: the
    stage's failure ends it KILLED; a nested run that had ended keeps its status."""
    _, paths = project
    cfg = make_config(**{"tracking.enabled": True})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client, exp_id = tracking.connect(cfg.tracking, paths)
    monkeypatch.setenv(tracking.PARENT_ENV, client.create_run(exp_id, run_name="pipeline (test)").info.run_id)
    with pytest.raises(RuntimeError, match="boom"), tracking.stage_run(cfg, paths, "finetune") as run_id:
        nested = {"mlflow.parentRunId": run_id}
        killed = client.create_run(exp_id, run_name="finetune-baseline", tags=nested).info.run_id  # left RUNNING
        done = client.create_run(exp_id, run_name="finetune-adapted", tags=nested).info.run_id
        client.set_terminated(done, "FAILED")
        raise RuntimeError("boom")
    assert client.get_run(killed).info.status == "KILLED" and client.get_run(done).info.status == "FAILED"
    assert client.get_run(run_id).info.status == "FAILED"


def test_without_a_dvc_parent_each_cli_stage_gets_its_own_parent(project, monkeypatch: pytest.MonkeyPatch) -> None:
    _, paths = project
    cfg = make_config(**{"tracking.enabled": True, "finetune.max_steps": 321})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    for _ in range(2):
        with tracking.stage_run(cfg, paths, "ingest"):
            pass
    runs = _runs(paths)
    parents = [r for r in runs if r.data.tags.get("adaptbert.kind") == "pipeline"]
    assert len(parents) == 2 and all(p.data.tags["adaptbert.trigger"] == "cli" for p in parents)
    assert parents[0].data.params["finetune.max_steps"] == "321"  # the parent holds the whole resolved config
    assert (paths.root / "mlflow.db").exists() and (paths.root / "mlartifacts").is_dir()


def test_stages_of_one_dvc_process_share_a_parent_across_a_clock_step(project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``dvc`` process is known by pid and start time; Linux reports that start time from the wall clock, which a
    clock step (NTP) moves by a second or so between two stages (seen in CI: register opened a second parent). The
    same pid started within seconds is the same process; another pid or a start minutes away is another execution."""
    _, paths = project
    cfg = make_config(**{"tracking.enabled": True})
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    owners = [{"pid": 4242, "create_time": 1_700_000_000.0 + shift} for shift in (0.0, 1.0, -1.0)]
    owners += [{"pid": 4243, "create_time": 1_700_000_000.0}, {"pid": 4243, "create_time": 1_700_000_600.0}]
    parents = []
    for owner in owners:
        monkeypatch.setattr(tracking, "pipeline_owner", lambda owner=owner: owner)
        with tracking.stage_run(cfg, paths, "ingest") as run_id:
            parents.append(_parent_of(paths, run_id))
    assert parents[0] == parents[1] == parents[2]  # one execution across a step of the clock either way
    assert len({parents[0], parents[3], parents[4]}) == 3  # another pid; the same pid reused minutes later


def _parent_of(paths: Paths, run_id: str | None) -> str:
    from mlflow import MlflowClient

    assert run_id is not None
    return MlflowClient(tracking.tracking_uri(paths)).get_run(run_id).data.tags["mlflow.parentRunId"]


def test_tracking_disabled_logs_nothing(project) -> None:
    _, paths = project
    with tracking.stage_run(make_config(), paths, "ingest") as run_id:
        assert run_id is None
    assert not (paths.root / "mlflow.db").exists()


def test_an_unreachable_server_fails_fast_naming_the_url(tmp_path: Path) -> None:
    params = write_params(
        tmp_path / "params.yaml",
        **{
            "tracking.enabled": True,
            "tracking.retries": 2,
            "tracking.retry_backoff_s": 1,
            "tracking.request_timeout_s": 2,
        },
    )
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(tmp_path), "demo"],
        cwd=ROOT,
        env={**os.environ, "MLFLOW_TRACKING_URI": url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 4  # environment: the tracking store is down
    assert f"demo failed: MLflow tracking store {url} is unreachable after 2 retries" in proc.stderr
    assert "Connection refused" in proc.stderr and "Traceback" not in proc.stderr
    assert elapsed < 60, elapsed
    assert not (tmp_path / "data" / "demo").exists()  # the stage never ran


def _stage(tmp_path: Path, stage: str) -> subprocess.CompletedProcess[str]:
    params = write_params(tmp_path / "params.yaml", **{"tracking.enabled": True})
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", tracking.PARENT_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(tmp_path), stage],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_damaged_store_is_an_environment_error_before_any_work(tmp_path: Path) -> None:
    """A corrupt mlflow.db: exit 4 (Prefect retries it), naming the store and what to do; the stage never ran."""
    (tmp_path / "mlflow.db").write_bytes(b"this is not an sqlite database" * 100)
    proc = _stage(tmp_path, "demo")
    assert proc.returncode == 4, proc.stderr
    assert "demo failed: MLflow tracking store sqlite:///" in proc.stderr and "cannot be opened" in proc.stderr
    assert "move it aside to start a new store" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / "demo").exists()


def test_a_store_failing_after_the_commit_is_a_warning_and_the_outputs_stay(tmp_path: Path) -> None:
    """The stage committed its outputs, then logging its report fails (mlartifacts/ is a file, so no artifact can be
    written): exit 0 with a warning naming the store, never new outputs with a failed exit."""
    assert _stage(tmp_path, "demo").returncode == 0
    shutil.rmtree(tmp_path / "mlartifacts", ignore_errors=True)
    (tmp_path / "mlartifacts").write_text("not a folder")
    proc = _stage(tmp_path, "ingest")
    assert proc.returncode == 0, proc.stderr
    assert "ingest: warning: outputs committed, but their run is not (fully) logged to MLflow" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads((tmp_path / "reports" / "ingest.json").read_text())["corpus"]["documents_read"] > 0
