"""``adaptbert history``: every pipeline execution side by side, from a real MLflow store (sqlite)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT, write_params


def _execution(
    client, experiment: str, when: int, steps: str, adapted: float, ci_lows: list[float], dvc_exp: str | None = None
) -> str:
    """A parent run as the pipeline logs it (kind, trigger, commit, params, headline; inside `dvc exp run` the
    experiment's name) and its evaluate stage run."""
    parent = client.create_run(
        experiment,
        run_name=f"pipeline {when}",
        start_time=when,
        tags={
            "adaptbert.kind": "pipeline",
            "adaptbert.trigger": "dvc",
            "git.commit": "a" * 40,
            "adaptbert.served": "int8",
            **({"adaptbert.dvc_exp": dvc_exp} if dvc_exp else {}),
        },
    )
    pid = parent.info.run_id
    client.log_param(pid, "pretrain.max_steps", steps)
    client.log_param(pid, "seed", "13")
    for key, value in {"adapted": adapted, "baseline": 0.79, "gain": adapted - 0.79}.items():
        client.log_metric(pid, key, value)
    evaluate = client.create_run(
        experiment, run_name="evaluate", tags={"adaptbert.stage": "evaluate", "mlflow.parentRunId": pid}
    )
    for i, low in enumerate(ci_lows):
        client.log_metric(evaluate.info.run_id, f"tasks.t{i}.ci_low", low)
    # as evaluate logs its summary: the tasks whose CI of the gain lies above 0
    client.log_metric(evaluate.info.run_id, "summary.tasks_improved_significantly", sum(low > 0 for low in ci_lows))
    client.set_terminated(pid, "FINISHED")
    return pid


def test_history_lists_every_execution_the_params_that_differ_and_the_champion_timeline(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("adaptbert")
    _execution(client, experiment, 1_700_000_000_000, "300", 0.8347, [0.05, 0.003, -0.02, -0.02])
    _execution(client, experiment, 1_700_100_000_000, "600", 0.8412, [0.06, 0.01, 0.001, -0.01], "try-seed")
    client.create_registered_model("adaptbert")
    for _ in range(2):  # versions 1 and 2
        client.create_model_version("adaptbert", source=str(tmp_path), run_id=None)
    client.set_model_version_tag("adaptbert", "1", "promoted_at", "2026-12-01T10:00:00+0000")
    client.set_model_version_tag("adaptbert", "2", "promoted_at", "2026-12-02T10:00:00+0000")
    client.set_model_version_tag("adaptbert", "2", "previous_champion", "1")
    client.set_model_version_tag("adaptbert", "2", "promotion.forced", "true")

    params = write_params(tmp_path / "params.yaml")
    (tmp_path / "reports").mkdir()
    _dvc_experiment(tmp_path, "try-seed", seed=14)
    shown = _history(tmp_path, params)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:4] == ["started", "trigger", "status", "commit"]
    newest, oldest = lines[2].split(), lines[3].split()
    # newest first; points as every report reads them (0.0512 -> +5.1, 0.0447 -> +4.5: half up)
    assert newest[-3:] == ["+5.1", "3/4", "int8"] and oldest[-3:] == ["+4.5", "2/4", "int8"]
    assert "params that differ: pretrain.max_steps" in lines  # not seed: the same in both
    page = (tmp_path / "reports" / "history.html").read_text(encoding="utf-8")
    assert "<td>pretrain.max_steps</td><td>600</td><td>300</td>" in page
    ui = "http://127.0.0.1:5000/#/models/adaptbert/versions/{}?workflowType=machine_learning"  # a local store's UI
    v1, v2 = (f'<a href="{ui.format(v)}">v{v}</a>' for v in (1, 2))
    assert f"<td>{v1}</td><td>2026-12-01T10:00:00+0000</td><td>-</td><td>passed the gate</td>" in page
    assert f"<td>{v2}</td><td>2026-12-02T10:00:00+0000</td><td>{v1}</td><td>forced past the gate</td>" in page
    runs = re.findall(r'<a href="http://127.0.0.1:5000/#/runs/(\w+)\?workflowType=machine_learning">', page)
    assert len(runs) == 2  # each execution links to its MLflow run
    assert "3 of 4 tasks" in page and 'src="http' not in page  # self-contained: links out, loads nothing
    # the DVC experiment: its headline from its summary.json, the param it set, joined to its MLflow run by name
    assert newest[2:5] == ["dvc", "exp", "try-seed"]  # after the date and time
    table = shown.stdout.split("DVC experiments of ")[1].splitlines()
    assert table[0].endswith("(dvc exp show):")  # of the branch checked out
    assert table[3].split()[0] == "try-seed" and "81.4" in table[3] and "+1.0" in table[3]
    assert table[3].split()[-2:] == ["yes", "seed=14"]
    assert "<td>try-seed</td>" in page and "<td>seed = 14</td><td>pipeline 1700100000000</td>" in page


def _history(root: Path, params: Path) -> subprocess.CompletedProcess:
    """`adaptbert history` of ``root`` (its own sqlite store, whatever MLFLOW_TRACKING_URI says here)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "--root", str(root), "--params", str(params), "history"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
    )


def _dvc_experiment(root: Path, name: str, seed: int) -> None:
    """``root`` as a git + DVC repository whose one stage writes ``reports/summary.json`` from ``seed``; then
    ``dvc exp run -S seed=...`` as experiment ``name``."""
    score = (
        "import json, yaml; s = yaml.safe_load(open('params.yaml'))['seed']; "
        "json.dump({'adapted': 0.8 + s / 1000, 'gain': 0.01, 'served': 'int8'}, open('reports/summary.json', 'w'))"
    )
    stage = {
        "cmd": f'{sys.executable} -c "{score}"',
        "params": ["seed"],
        "metrics": [{"reports/summary.json": {"cache": False}}],
    }
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"score": stage}}))
    (root / ".gitignore").write_text("mlflow.db\nmlartifacts/\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (
        ["git", "init", "-q"],
        [sys.executable, "-m", "dvc", "init", "-q"],
        [*git, "add", "-A"],
        [*git, "commit", "-qm", "init"],
        [sys.executable, "-m", "dvc", "exp", "run", "-q", "-S", f"seed={seed}", "-n", name],
    ):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True)


def test_a_parent_run_inside_dvc_exp_run_carries_the_experiment_name(monkeypatch) -> None:
    from pipeline.tracking.runs import dvc_experiment_tag

    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    assert dvc_experiment_tag() == {}
    monkeypatch.setenv("DVC_EXP_NAME", "try-seed")  # what `dvc exp run` sets for the stages it runs
    assert dvc_experiment_tag() == {"adaptbert.dvc_exp": "try-seed"}


def test_an_experiments_params_are_shown_as_set_without_secrets() -> None:
    from pipeline.tracking.history import shown_param

    assert shown_param(14.0) == 14 and shown_param(0.5) == 0.5  # dvc exp show makes every integer a float
    assert shown_param("ray://user:secret@head:10001") == "ray://head:10001"


def test_a_store_missing_a_table_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """Issue 61 (Why 5): `sqlite3 mlflow.db "drop table latest_metrics"` then `adaptbert history` was an internal
    error (exit 1) with SQLAlchemy's traceback; now exit 4 naming the store, its first line, nothing of SQLAlchemy."""
    import sqlite3

    from mlflow import MlflowClient

    db = tmp_path / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    _execution(client, client.create_experiment("adaptbert"), 1_700_000_000_000, "300", 0.83, [0.01])
    with sqlite3.connect(db) as con:
        con.execute("drop table latest_metrics")
    params = write_params(tmp_path / "params.yaml")
    shown = _history(tmp_path, params)
    assert shown.returncode == 4, shown.stderr
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("history failed: MLflow tracking store sqlite:///"), shown.stderr
    assert "latest_metrics" in lines[0] and "Traceback" not in shown.stderr
