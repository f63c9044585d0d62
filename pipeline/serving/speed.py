"""A model's speed and memory the way it is served, in a process of its own per model.

:func:`serving_speed` answers requests through :class:`pipeline.serving.service.Predictor`, the code
``mlflow models serve`` runs: batch-1 requests (one test example at a time, the tasks in turn) for
p50/p95 latency, then batches of ``batch_size`` rows of one task for throughput. The compress stage
times the full model and every variant with :func:`speeds_in_worker`: one worker process
(``python -m pipeline.serving.speed``) imports torch and the serving code once, then forks a child
per model (where the OS forks), so each model's peak RSS is its own child's and no engine or thread
setting of another model leaks in (the worker itself never loads a model). Without ``fork`` each
model gets a fresh worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.sections.compress import LatencyConfig

# The batch-1 requests are timed in this many consecutive rounds: when other work on the machine comes and goes, the
# rounds' p50s disagree, and the serving rule compares two models only beyond that spread (gate.choose_served).
ROUNDS = 4


def round_robin(frame: Any) -> list[dict[str, Any]]:
    """The request rows with the tasks interleaved (task a, b, c, a, b, c, ...)."""
    groups = [g.to_dict("records") for _, g in frame.groupby("task", sort=True)]
    rows: list[dict[str, Any]] = []
    for i in range(max(len(g) for g in groups)):
        rows.extend(g[i] for g in groups if i < len(g))
    return rows


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB): ``VmHWM`` where Linux has it, else ``ru_maxrss``.

    ``ru_maxrss`` survives ``fork`` + ``exec`` on Linux, so a child of a big parent would report the
    parent's peak; ``VmHWM`` belongs to the new address space that ``exec`` creates.
    """
    import resource

    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    scale = 1024 * 1024 if sys.platform == "darwin" else 1024  # bytes on macOS, KB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def serving_speed(
    model_dir: Path, requests: Any, precisions: list[str], lc: LatencyConfig, max_seq_length: int, doc_stride: int
) -> dict[str, Any]:
    """Batch-1 latency (ms, p50/p95) and batch throughput (rows/s) per precision, and this process's peak RSS (MB)."""
    import pandas as pd
    import torch

    from pipeline.serving.service import Predictor

    rss_before = peak_rss_mb()
    rows = round_robin(requests)
    by_task = {t: g for t, g in requests.groupby("task", sort=True)}
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "rss_before_load_mb": round(rss_before, 1)}
    for name in precisions:
        start = time.perf_counter()
        predictor = Predictor(model_dir, max_seq_length, doc_stride, batch_size=lc.batch_size, precision=name)
        load_s = time.perf_counter() - start
        for i in range(lc.warmup):
            predictor.predict(pd.DataFrame([rows[i % len(rows)]]))
        times = []
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        for i in range(lc.requests):
            frame = pd.DataFrame([rows[i % len(rows)]])
            t = time.perf_counter()
            predictor.predict(frame)
            times.append(time.perf_counter() - t)
        done, spent = 0, 0.0
        tasks = sorted(by_task)
        batches = {t: pd.concat([g] * (lc.batch_size // len(g) + 1)).head(lc.batch_size) for t, g in by_task.items()}
        for frame in batches.values():  # untimed: the first batch of a shape pays for kernel selection
            predictor.predict(frame)
        for i in range(lc.throughput_batches):
            frame = batches[tasks[i % len(tasks)]]
            t = time.perf_counter()
            predictor.predict(frame)
            spent += time.perf_counter() - t
            done += len(frame)
        ms = np.array(times) * 1000
        if load is not None:  # the busiest minute around the timed requests (Unix's 1-minute load average)
            load = max(load, os.getloadavg()[0])
        out[name] = {
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p95_ms": round(float(np.percentile(ms, 95)), 2),
            "p50_rounds_ms": [round(float(np.percentile(r, 50)), 2) for r in np.array_split(ms, min(ROUNDS, len(ms)))],
            "load_1m": None if load is None else round(load, 2),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "throughput_rows_per_s": round(done / spent, 1),
            "load_s": round(load_s, 2),
        }
        del predictor
    out["peak_rss_mb"] = round(peak_rss_mb(), 1)
    return out


def speeds_in_worker(
    jobs: dict[str, tuple[Path, list[str]]],
    requests_file: Path,
    lc: LatencyConfig,
    max_seq_length: int,
    doc_stride: int,
    timeout_s: float = 1800,
) -> dict[str, dict[str, Any]]:
    """:func:`serving_speed` of each ``name -> (model directory, precisions)``, each model in a child of one
    worker process that imported the serving code once (a fresh worker per model where the OS cannot fork)."""
    settings = {
        "requests": str(requests_file),
        "latency": lc.model_dump(),
        "max_seq_length": max_seq_length,
        "doc_stride": doc_stride,
    }
    batches = [jobs] if hasattr(os, "fork") else [{name: job} for name, job in jobs.items()]
    speeds: dict[str, dict[str, Any]] = {}
    for batch in batches:
        todo = {name: {"model_dir": str(model_dir), "precisions": p} for name, (model_dir, p) in batch.items()}
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.serving.speed", json.dumps({**settings, "jobs": todo})],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"measuring {sorted(batch)} failed: {proc.stderr.strip().splitlines()[-1:]}")
        speeds |= json.loads(proc.stdout.strip().splitlines()[-1])
    return speeds


def in_child(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measure()`` in a forked child of this process; its JSON-able result (an error in the child is raised
    here as a ``RuntimeError`` naming it). The child's ``VmHWM`` starts at its own RSS on Linux, not at this
    process's peak, so :func:`peak_rss_mb` in it is the child's (``tests/unit/test_speed.py`` checks)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, send the result, leave without running the parent's cleanup
        os.close(read)
        code = 0
        try:
            payload = json.dumps(measure())
        except BaseException as err:  # reported through the pipe, the child must not raise
            payload, code = json.dumps({"error": f"{type(err).__name__}: {err}"}), 1
        try:
            with os.fdopen(write, "w") as out:
                out.write(payload)
        finally:  # also when the worker is gone (a killed stage): the pipe is closed, nothing is left to tell
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as got:
        data = got.read()
    _, status = os.waitpid(pid, 0)
    result = json.loads(data) if data else {"error": f"the child ended with status {status} and sent nothing"}
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(result.get("error", f"the child ended with status {status}"))
    return result


def import_serving_code() -> None:
    """What every child would import: torch, transformers' BERT and the serving path, loaded once before forking.
    The task types import seqeval and MLflow's schema types lazily when a model is loaded and served: imported
    here too, or each child would import them again (measured: 2.4 s per model with the tiny test model)."""
    import mlflow.types.schema  # noqa: F401
    import seqeval.metrics.sequence_labeling  # noqa: F401
    import torch  # noqa: F401
    from transformers import BertModel  # noqa: F401

    import pipeline.compression.variants
    import pipeline.modelling.precision
    import pipeline.serving.service
    import pipeline.training.multitask  # noqa: F401


def main(argv: list[str]) -> None:
    import pandas as pd

    args = json.loads(argv[0])
    requests = pd.read_parquet(args["requests"])
    lc = LatencyConfig(**args["latency"])

    def measure(job: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        return lambda: serving_speed(
            Path(job["model_dir"]), requests, job["precisions"], lc, args["max_seq_length"], args["doc_stride"]
        )

    if hasattr(os, "fork"):
        import_serving_code()
        speeds = {name: in_child(measure(job)) for name, job in args["jobs"].items()}
    else:  # one model per worker (speeds_in_worker): measured in this fresh process
        speeds = {name: measure(job)() for name, job in args["jobs"].items()}
    print(json.dumps(speeds))


if __name__ == "__main__":
    main(sys.argv[1:])
