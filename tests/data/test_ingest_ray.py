"""``ingest.engine: ray`` on a real local Ray: the same corpus files, byte for byte, and the same report as the
local engine, for a corpus spread over files with every kind of drop; bad input named as the local engine names it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from pipeline.core.errors import DataError
from pipeline.core.paths import Paths
from pipeline.stages import ingest
from pipeline.text.corpus_disk import INDEX_DIR
from tests.conftest import environment_skip, make_config
from tests.data.mixed_corpus import corpus_bytes, run_engine, write_mixed_corpus

try:
    import ray
except ImportError:
    environment_skip("Ray is not installed", module=True)


@pytest.fixture(scope="module")
def local_ray():
    """One real local Ray for the module (each engine run joins it rather than starting its own)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("chunk_docs", [5000, 7])  # one row group and batch; many (the batched checks' boundaries)
def test_the_ray_engine_writes_the_local_engines_files_byte_for_byte(
    local_ray, built_demo, tmp_path: Path, chunk_docs: int
) -> None:
    sources = write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    local = run_engine(built_demo, tmp_path / "local", "local", sources, **{"ingest.chunk_docs": chunk_docs})
    distributed = run_engine(built_demo, tmp_path / "ray", "ray", sources, **{"ingest.chunk_docs": chunk_docs})
    assert distributed == local
    assert corpus_bytes(tmp_path / "ray") == corpus_bytes(tmp_path / "local")
    assert not (tmp_path / "ray" / INDEX_DIR).exists()  # the tasks' spill files are removed after the run
    c = local["corpus"]  # the corpus really has every kind of drop, so the equality above covers each of them
    assert c["dropped"]["duplicate"] == 3
    assert c["dropped"]["near_duplicate"] == 2  # chain_b and e.csv's copy; chain_c stays (its kept original differs)
    assert c["dropped"]["leakage"] == 1 and c["dropped"]["contaminated"] == 1 and c["dropped"]["bad_record"] == 1
    assert set(c["errors_skipped"]) == {"malformed-json", "wrong-type", "missing-field", "empty-file"}
    assert len(c["sources"]) == 5 and c["empty_sources"] == [str(tmp_path / "corpus" / "d.jsonl")]


def test_relative_paths_are_named_as_the_local_engine_names_them(
    local_ray, built_demo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage in the project directory with relative source paths (`dvc repro`'s case): Ray tasks run in another
    directory, open the files by absolute path, and the outputs and error examples name them relatively."""
    write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    monkeypatch.chdir(tmp_path)
    sources = [{"type": "files", "path": "corpus/*.jsonl"}, {"type": "files", "path": "corpus/*[tv]"}]
    local = run_engine(built_demo, Path("."), "local", sources)
    before = corpus_bytes(Path("."))
    shutil.rmtree("data/demo")
    assert run_engine(built_demo, Path("."), "ray", sources) == local
    assert corpus_bytes(Path(".")) == before
    assert {e["file"] for e in local["corpus"]["error_examples"]} == {"corpus/c.jsonl", "corpus/d.jsonl"}


def test_a_bad_record_stops_the_ray_engine_naming_file_line_and_rule(local_ray, built_demo, tmp_path: Path) -> None:
    sources = write_mixed_corpus(tmp_path / "corpus", built_demo[1].demo)
    (tmp_path / "corpus" / "d.jsonl").unlink()  # one bad file: with several, a task that meets one names it first
    root = tmp_path / "proj"
    run_engine(built_demo, root, "ray", [sources[1]])  # good outputs first: b.txt and e.csv only
    before = corpus_bytes(root)
    shutil.rmtree(root / "data" / "demo")
    with pytest.raises(DataError, match=r"c\.jsonl:2: \[malformed-json\]") as info:
        run_engine(built_demo, root, "ray", sources, **{"ingest.on_error": "fail"})
    assert (info.value.rule, info.value.line) == ("malformed-json", 2)
    assert corpus_bytes(root) == before  # the previous outputs stay


def test_a_corpus_with_no_document_left_is_named_as_such(local_ray, built_demo, tmp_path: Path) -> None:
    """Nothing passes the filters: the group-bys get no pairs; the stage's own error, no traceback."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "too short"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="no-documents"):
        run_engine(built_demo, tmp_path / "p", "ray", [{"type": "files", "path": str(folder / "*.jsonl")}])


def test_the_cli_starts_a_local_ray_for_the_stage_and_stops_it(built_demo, tmp_path: Path) -> None:
    """``python -m pipeline ingest`` with ``engine: ray`` and no address: a local Ray of ``ray.num_cpus`` for the run,
    gone after it; the corpus equals the local engine's (same project, same input)."""
    import subprocess
    import sys

    from tests.conftest import ROOT, write_params

    _, demo_paths = built_demo
    shutil.copytree(demo_paths.demo, tmp_path / "data" / "demo")
    params = write_params(tmp_path / "params.yaml", **{"ingest.engine": "ray", "ray.num_cpus": 2})
    command = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(tmp_path), "ingest"]
    ray_dir = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_TMPDIR": str(ray_dir)}  # this run's Ray, told apart from any other test's
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    report = json.loads((tmp_path / "reports" / "ingest.json").read_text())
    assert report["engine"] == "ray" and report["engine_cluster"] == {"joined": False, "cpus": 2}
    ours = corpus_bytes(tmp_path)
    local = make_config()
    ingest.run(local, Paths(tmp_path))  # the same project again with the local engine
    assert corpus_bytes(tmp_path) == ours
    assert list(ray_dir.rglob("session_*")), "the stage started no Ray of its own"
    assert not ray_processes_in(ray_dir)  # the stage's own Ray stopped with it
    shutil.rmtree(ray_dir, ignore_errors=True)


def ray_processes_in(ray_dir: Path) -> list[int]:
    """Process ids of the Ray processes (raylet, GCS, workers) whose command line names ``ray_dir``."""
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"]) if str(ray_dir) in " ".join(p.info["cmdline"] or [])]


def test_an_address_no_cluster_answers_is_named_within_seconds(built_demo, tmp_path: Path) -> None:
    """``ray.address`` pointing at nothing: exit 4 naming the address in seconds (``ray.init`` retries for minutes)."""
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT, free_port, write_params

    shutil.copytree(built_demo[1].demo, tmp_path / "data" / "demo")
    address = f"127.0.0.1:{free_port()}"
    params = write_params(tmp_path / "params.yaml", **{"ingest.engine": "ray", "ray.address": address})
    command = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(tmp_path), "ingest"]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and time.monotonic() - start < 60
    assert f"no Ray cluster answers at {address}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "corpus").exists()  # nothing half-written
    # the same address from RAY_ADDRESS (was: retried for minutes)
    params = write_params(tmp_path / "params.yaml", **{"ingest.engine": "ray", "ray.address": ""})
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_ADDRESS": address}
    )
    assert done.returncode == 4 and f"RAY_ADDRESS: no Ray cluster answers at {address}" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "data" / "corpus").exists()


def test_auto_with_no_cluster_to_join_is_an_unavailable_cluster(monkeypatch) -> None:
    """Was: internal error ConnectionError (exit 1), which the Prefect flow does not retry. (``ray.init`` is made to
    find nothing: a real ``auto`` would join a local Ray that another test runs at the same time.)"""
    import ray

    from pipeline.core.errors import ClusterUnavailable
    from pipeline.text.ray_cluster import ray_cluster
    from tests.conftest import make_config

    def no_cluster(**kwargs):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_cluster)
    joining = ray_cluster(make_config(**{"ray.address": "auto"}).ray)
    with pytest.raises(ClusterUnavailable, match=r"ray\.address: no Ray cluster to join at 'auto' \(Could not find"):
        joining.__enter__()
