"""Shared fixtures: a small demo project built once per session in a temporary directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Each pytest-xdist worker gets its share of the cores (and so does every subprocess it starts, a stage or `dvc
# repro`, through the environment): two workers with two threads each on two cores oversubscribe them (OpenMP's
# spinning threads wait on each other); measured on the 2-core EPYC, two tiny `dvc repro` side by side took 184 s
# with the default threads and 150 s with one each (one alone: 158 s). Set before torch is imported.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))

from pipeline.core.config import Config, load_config  # noqa: E402 (after the thread count above)
from pipeline.core.paths import Paths  # noqa: E402
from pipeline.stages import ingest  # noqa: E402
from pipeline.text import demo_domain as demo  # noqa: E402
from tools import team_stack  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Small demo sizes: seconds, not minutes. Validation thresholds stay those of params.yaml.
SMALL: dict[str, Any] = {
    "demo.corpus_docs": 400,
    "demo.role_examples": 400,
    "demo.pair_examples": 300,
    "demo.ner_examples": 300,
    "demo.qa_examples": 200,
    "tokenize.extend_vocab.enabled": True,  # off by default; on here so tests cover the richer path (new rows, baseline vocab)
    "tracking.enabled": False,  # stage runs go to MLflow only where a test checks them (each process pays the mlflow import)
}


# The test files that keep one worker busiest (seconds of a worker, `--durations=0` on the 2-core EPYC, 2026-12-04),
# longest first: they are handed out first (pyproject.toml: `--dist loadfile --no-loadscope-reorder`; xdist's own
# reorder starts the files with the most tests, which left a 400 s end-to-end test to run last, alone), so both
# workers finish together. The other files follow in collection order.
LONGEST_FIRST = (
    "tests/e2e/test_team_stack.py",  # ~450 (Xeon, 2026-12-07): the team stack up, a pipeline against it, its checks
    "tests/data/test_real_data.py",  # 428: the biomed profile end to end on slices of the real data
    "tests/e2e/test_prefect_server.py",  # 429: two full runs through a Prefect server, one killed and resumed
    "tests/e2e/test_dvc_pipeline.py",  # 344
    "tests/e2e/test_dapt_study.py",  # 223
    "tests/e2e/test_damage.py",  # ~155: every declared output damaged, every consumer run (with the tiny build)
    "tests/e2e/test_register.py",  # 202
    "tests/model/test_pretrain.py",  # 167
    "tests/model/test_electra.py",  # ~150: pretrain, fine-tune, kill -9 resume and DDP of the ELECTRA pair
    "tests/e2e/test_benchmarks.py",  # 135
    "tests/model/test_select.py",  # 98
    "tests/model/test_task_types.py",  # 79
    "tests/e2e/test_hardening.py",  # 70
)


# CI sets ADAPTBERT_TEST_REQUIRE_ENV=1 (.ci/run): a test that needs a part of the environment the install provides
# (headless Chromium, mount rights, the shared datasets, Ray) then fails where it would skip, so a broken install cannot
# pass green. Hardware (bf16, a GPU) is never required: the machines differ.
REQUIRE_ENV = os.environ.get("ADAPTBERT_TEST_REQUIRE_ENV") == "1"


def environment_skip(reason: str, module: bool = False) -> None:
    """Skip for a missing part of the environment (``reason`` names it), or fail under ``ADAPTBERT_TEST_REQUIRE_ENV``."""
    if REQUIRE_ENV:
        pytest.fail(f"{reason} (ADAPTBERT_TEST_REQUIRE_ENV=1: the environment must provide it)", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def needs_environment(available: bool, reason: str) -> pytest.MarkDecorator:
    """A mark: the test needs what ``reason`` names (:func:`environment_skip` when not ``available``)."""
    return pytest.mark.environment(available, reason)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("environment"):
        available, reason = mark.args
        if not available:
            environment_skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files of :data:`LONGEST_FIRST` first, in its order (a stable sort: tests within a file keep theirs)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def restore_environment() -> Iterator[None]:
    """Put ``os.environ`` back after each test: ``mlflow.set_tracking_uri`` (called by in-process tracking)
    exports MLFLOW_TRACKING_URI, which would send a later test's ``dvc repro`` runs to the earlier test's store
    (which test comes later depends on the order, and with ``-n`` on the worker)."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


def mount(*args: str) -> bool:
    """``mount ARGS`` where this process may (root, a mount binary); whether it worked."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``64k``, ``2m``) mounted on ``folder`` for the block: a disk that fills up (skipped, or
    failed under ADAPTBERT_TEST_REQUIRE_ENV, where this process may not mount)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)):
        environment_skip("cannot mount a small tmpfs here (needs root and mount rights)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def make_config(**overrides: Any) -> Config:
    """The repository's params.yaml with the small demo sizes and ``{"a.b": v}`` overrides."""
    return load_config(ROOT / "params.yaml", {**SMALL, **overrides})


def corpus_rows(paths: Paths, *splits: str) -> list[dict[str, Any]]:
    """Every row of the ingested corpus's ``splits`` (default: train, validation), shard after shard."""
    import pyarrow.parquet as pq

    from pipeline.text.corpus_shards import SPLITS, corpus_files

    return [
        row for s in splits or SPLITS for f in corpus_files(paths.corpus, s) for row in pq.read_table(f).to_pylist()
    ]


def corpus_texts(paths: Paths, *splits: str) -> list[str]:
    """Every text of the ingested corpus's ``splits`` (default: train, validation), in read order per split."""
    return [row["text"] for row in corpus_rows(paths, *splits)]


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Paths]:
    """demo + ingest + validate once per session; tests copy it before changing anything."""
    from pipeline.stages import validate

    paths = Paths(tmp_path_factory.mktemp("demo_project"))
    cfg = make_config()
    demo.run(cfg.demo, paths.demo)
    ingest.run(cfg, paths)
    validate.run(cfg, paths)  # tokenize refuses data that has not passed validation
    return cfg, paths


@pytest.fixture
def project(built_demo: tuple[Config, Paths], tmp_path: Path) -> tuple[Config, Paths]:
    """A private copy of the built demo project."""
    cfg, src = built_demo
    for sub in ("data", "reports"):
        shutil.copytree(src.root / sub, tmp_path / sub)
    return cfg, Paths(tmp_path)


def write_params(path: Path, **overrides: Any) -> Path:
    """A params.yaml at ``path``: the repository's, small demo sizes, plus ``{"a.b": v}`` overrides."""
    import yaml

    from pipeline.core.config import load_params, set_dotted

    data = load_params(ROOT / "params.yaml")
    for dotted, value in {**SMALL, **overrides}.items():
        set_dotted(data, dotted, value)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# A tiny scratch BERT and a short run: seconds on CPU.
TINY_PRETRAIN: dict[str, Any] = {
    "pretrain.base_model": "scratch",
    "pretrain.scratch.hidden_size": 32,
    "pretrain.scratch.num_hidden_layers": 2,
    "pretrain.scratch.num_attention_heads": 2,
    "pretrain.scratch.intermediate_size": 64,
    "pretrain.max_steps": 6,
    "pretrain.micro_batch_size": 4,
    "pretrain.warmup_steps": 1,
    "pretrain.logging_steps": 1,
    "pretrain.eval_steps": 3,
    "pretrain.save_steps": 3,
    "pretrain.save_total_limit": 3,
    "pretrain.eval_max_blocks": 16,
    "pretrain.learning_rate": 1e-3,
}

# A short multi-task run on that tiny model: seconds on CPU.
TINY_FINETUNE: dict[str, Any] = {
    "finetune.max_steps": 30,
    "finetune.batch_size": 8,
    "finetune.eval_steps": 10,
    "finetune.logging_steps": 5,
    "finetune.learning_rate": 1e-3,
    "evaluate.bootstrap_resamples": 200,
}


# Compression in seconds: a few distillation / recovery steps, few timed requests.
TINY_COMPRESS: dict[str, Any] = {
    "compress.distill.max_steps": 10,
    "compress.prune.fraction": 0.5,
    "compress.prune.recovery_steps": 5,
    "compress.prune.importance_batches": 2,
    "compress.latency.requests": 8,
    "compress.latency.warmup": 1,
    "compress.latency.throughput_batches": 2,
    "compress.latency.batch_size": 4,
}


@pytest.fixture(scope="session")
def pretrained(built_demo: tuple[Config, Paths], tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Paths]:
    """The small demo project after tokenize and a tiny pretrain (once per session; copy before changing)."""
    from pipeline.stages import pretrain, tokenize

    _, src = built_demo
    paths = Paths(tmp_path_factory.mktemp("pretrained_project"))
    for sub in ("data", "reports"):
        shutil.copytree(src.root / sub, paths.root / sub)
    cfg = make_config(**TINY_PRETRAIN, **TINY_FINETUNE)
    tokenize.run(cfg, paths)
    pretrain.run(cfg, paths)
    return cfg, paths


def copy_project(src: Paths, dst: Path) -> Paths:
    """A private copy of a built project (data, reports, models, checkpoints)."""
    for sub in ("data", "reports", "models", "checkpoints"):
        if (src.root / sub).exists():
            shutil.copytree(src.root / sub, dst / sub)
    return Paths(dst)


@pytest.fixture(scope="session")
def finetuned(pretrained: tuple[Config, Paths], tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The tiny project after finetune + evaluate (once per session; copy before changing)."""
    from pipeline.stages import evaluate, finetune

    cfg, src = pretrained
    paths = copy_project(src, tmp_path_factory.mktemp("finetuned"))
    report = finetune.run(cfg, paths)
    metrics = evaluate.run(cfg, paths)
    return cfg, paths, report, metrics


free_port = team_stack.free_port


def wait_for_http(url: str, proc: subprocess.Popen, log: Path, seconds: float = 120) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log if it dies or never answers."""
    team_stack.wait_for(url, proc, "the server", log, seconds)


@contextlib.contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[dict]]]:
    """A webhook on 127.0.0.1 (a thread of this process) that keeps every JSON body POSTed to it: (url, bodies)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/secret-token-abc123", received
    finally:
        server.shutdown()


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` (sqlite backend, local artifact root) on a free localhost port."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    log = root / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            # MLflow 3's server also starts Huey job consumers (GenAI jobs) that import all of MLflow again and poll:
            # measured 145 CPU-seconds in CI's first 16 minutes, for jobs no test runs
            env={**os.environ, "MLFLOW_TRACKING_URI": "", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def make_repo(repo: Path, **overrides: Any) -> Path:
    """A fresh git + DVC repository of the project's tracked files (as a new clone), params with ``overrides``."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for f in files:
        if (ROOT / f).is_file():
            (repo / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, repo / f)
    for f in (
        "dvc.lock",
        "reports/ingest.json",
        "reports/validation.json",
        "reports/validated.json",
        "reports/tokenize.json",
        "reports/pretrain.json",
        "reports/finetune.json",
        "reports/metrics.json",
        "reports/evaluation.md",
        "reports/errors.json",
        "reports/compression.json",
        "reports/compression.md",
        "reports/summary.json",
    ):
        (repo / f).unlink(missing_ok=True)  # start as a fresh clone of a new project would
    if overrides:
        write_params(repo / "params.yaml", **overrides)
    for cmd in (
        ["git", "init", "-q"],
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A"],
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"],
    ):
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
    return repo
