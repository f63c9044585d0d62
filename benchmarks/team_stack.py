"""Benchmark: tracking a stage's run and registering a model, local files vs the team stack (PostgreSQL + S3).

    python -m benchmarks.team_stack                 # ~2 minutes on 2 cores (the stack starts in ~40 s)
    python -m benchmarks.team_stack --rounds 5

What a stage and the register stage send to MLflow, with synthetic content of the sizes a default run has: a run
with 40 params, 300 metric points (curves), 6 small report files and one 90 MB model file (MiniLM's weights are
91 MB), then a registered model version from that run with 12 tags and two aliases. Three stores, taking turns round
by round so that other work on the machine slows each alike:

- ``local files``: the embedded default, ``sqlite:///mlflow.db`` with artifacts in a folder, in-process;
- ``server, local``: ``mlflow server`` on SQLite with proxied artifacts in a local folder (what the tests use);
- ``team (PostgreSQL + S3)``: ``python -m tools.team_stack``: ``mlflow server`` on PostgreSQL, artifacts proxied to
  moto's S3 on 127.0.0.1.

Reports the median seconds of each part and the ratio of the team stack to the local files. Results:
``benchmarks/results/team_stack.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import save_results
from tools import team_stack

MODEL_MB = 90


def log_run(client: Any, experiment: str, files: Path) -> tuple[str, float]:
    """One stage's run: params, curves, reports and the model file; (run id, seconds)."""
    from mlflow.entities import Metric, Param

    start = time.perf_counter()
    exp = client.get_experiment_by_name(experiment) or client.get_experiment(client.create_experiment(experiment))
    run = client.create_run(exp.experiment_id)
    rid = run.info.run_id
    now = int(time.time() * 1000)
    params = [Param(f"finetune.p{i}", str(i)) for i in range(40)]
    metrics = [Metric(f"curve{i % 3}", float(i), now, i) for i in range(300)]
    client.log_batch(rid, metrics=metrics, params=params)
    client.log_artifacts(rid, str(files / "reports"), "reports")
    client.log_artifact(rid, str(files / "model.safetensors"), "model")
    client.set_terminated(rid)
    return rid, time.perf_counter() - start


def register(client: Any, name: str, run_id: str) -> float:
    """A model version from the run's model folder, its tags, challenger and champion: seconds."""
    from mlflow.exceptions import MlflowException

    start = time.perf_counter()
    with contextlib.suppress(MlflowException):  # exists from an earlier round
        client.create_registered_model(name)
    version = client.create_model_version(name, f"runs:/{run_id}/model", run_id=run_id).version
    for i in range(12):
        client.set_model_version_tag(name, version, f"tag{i}", str(i))
    for alias in ("challenger", "champion"):
        client.set_registered_model_alias(name, alias, version)
    client.get_model_version_by_alias(name, "champion")
    return time.perf_counter() - start


def synthetic_files(folder: Path) -> Path:
    (folder / "reports").mkdir(parents=True)
    for i in range(6):
        (folder / "reports" / f"report{i}.json").write_text('{"x": 1}\n' * 200, encoding="utf-8")
    with open(folder / "model.safetensors", "wb") as f:
        f.write(os.urandom(MODEL_MB * 1024 * 1024))
    return folder


def local_server(folder: Path) -> tuple[subprocess.Popen, str]:
    """``mlflow server`` on SQLite with proxied artifacts in a local folder."""
    port = team_stack.free_port()
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    argv += ["--backend-store-uri", f"sqlite:///{folder / 'server.db'}", "--artifacts-destination", str(folder / "a")]
    env = {**team_stack.base_env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = folder / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    team_stack.wait_for(f"http://127.0.0.1:{port}/health", proc, "mlflow server", log, 180)
    return proc, f"http://127.0.0.1:{port}"


def bench(rounds: int, work: Path) -> list[dict[str, Any]]:
    from mlflow import MlflowClient

    files = synthetic_files(work / "files")
    stack = team_stack.up(work / "stack", worker=False)
    server, server_uri = local_server(work)
    try:
        stores = {
            "local files (sqlite + folder)": MlflowClient(f"sqlite:///{work / 'local.db'}"),
            "server, local (SQLite + folder, proxied)": MlflowClient(server_uri),
            "team (PostgreSQL + S3, proxied)": MlflowClient(stack.mlflow_uri),
        }
        for client in stores.values():  # the local store's artifact root: a folder next to it
            if client.tracking_uri.startswith("sqlite") and not client.get_experiment_by_name("bench"):
                client.create_experiment("bench", artifact_location=(work / "local-artifacts").as_uri())
        times: dict[str, dict[str, list[float]]] = {k: {"run": [], "register": []} for k in stores}
        for _ in range(rounds):
            for label, client in stores.items():
                rid, seconds = log_run(client, "bench", files)
                times[label]["run"].append(seconds)
                times[label]["register"].append(register(client, "bench-model", rid))
    finally:
        server.terminate()
        team_stack.down(stack)
    base = {part: statistics.median(times[next(iter(stores))][part]) for part in ("run", "register")}
    return [
        {
            "store": label,
            "run_s": round(statistics.median(t["run"]), 3),
            "register_s": round(statistics.median(t["register"]), 3),
            "run_vs_local": round(statistics.median(t["run"]) / base["run"], 2),
            "register_vs_local": round(statistics.median(t["register"]) / base["register"], 2),
        }
        for label, t in times.items()
    ]


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"| store | a stage's run (40 params, 300 points, 6 reports, {MODEL_MB} MB model), median s | vs local "
        "| registering a version (12 tags, 2 aliases), median s | vs local |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['store']} | {r['run_s']} | {r['run_vs_local']:.2f}x | {r['register_s']} | {r['register_vs_local']:.2f}x |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each times every store once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="adaptbert-team-bench-") as work:
        rows = bench(args.rounds, Path(work))
    save_results(
        "team_stack",
        f"--rounds {args.rounds}",
        f"Synthetic stage run and registration of the default run's sizes ({MODEL_MB} MB model); the stores take "
        "turns round by round; all servers on 127.0.0.1 (no network latency: a remote team server adds its round "
        "trips).",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
