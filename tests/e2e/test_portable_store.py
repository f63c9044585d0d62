"""A copied checkout uses its own MLflow files (issue 63, item 6): its store is re-rooted when it is opened, the
original's store and artifacts are left as they were."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.core.paths import Paths
from pipeline.tracking.store_root import LOCATIONS, as_path
from tests.conftest import make_config

CFG = make_config(**{"tracking.enabled": True})


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + f.read_bytes())
    return h.hexdigest()


def _project_with_a_run(original: Path, tmp_path: Path) -> str:
    """A project whose own store holds a run with an artifact and a dataset input, and a registered version of it."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput

    from pipeline.tracking import runs

    original.mkdir()
    client, exp = runs.connect(CFG.tracking, Paths(original))
    run = client.create_run(exp, run_name="pipeline")
    run_id = run.info.run_id
    (tmp_path / "card.md").write_text("v1", encoding="utf-8")
    client.log_artifact(run_id, str(tmp_path / "card.md"))
    (original / "data").mkdir()
    (original / "data" / "test.parquet").write_bytes(b"PAR1")
    source = resolve_dataset_source(str(original / "data" / "test.parquet"))
    dataset = MetaDataset(source=source, name="ner/test", digest="abc")._to_mlflow_entity()
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, [])])
    client.set_terminated(run_id)
    client.create_registered_model("adaptbert")
    client.create_model_version("adaptbert", f"{run.info.artifact_uri}/card.md", run_id=run_id)
    return run_id


def test_a_copied_checkout_reads_and_writes_its_own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from mlflow.tracking._tracking_service.utils import _artifact_repos_cache

    from pipeline.tracking import runs

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = CFG
    original = tmp_path / "project"
    run_id = _project_with_a_run(original, tmp_path)
    before = {"all": _digest(original)}

    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(original), str(copy)], check=True)
    # as a new process would: mlflow.set_tracking_uri set the variable, and MLflow caches each run's artifact store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _artifact_repos_cache.clear()
    client, exp = runs.connect(cfg.tracking, Paths(copy))
    copied = client.get_run(run_id)
    assert as_path(copied.info.artifact_uri).is_relative_to(copy)  # was: the original's mlartifacts/
    assert as_path(client.get_experiment(exp).artifact_location) == copy / "mlartifacts"
    (read,) = copied.inputs.dataset_inputs  # a dataset input names the copy's file
    assert json.loads(read.dataset.source)["uri"] == str(copy / "data" / "test.parquet")
    version = client.get_model_version("adaptbert", "1")
    assert as_path(version.source).is_relative_to(copy)
    # the copy writes into its own folder, reads its own files, and the original stays as it was
    (tmp_path / "more.md").write_text("v2", encoding="utf-8")
    client.log_artifact(run_id, str(tmp_path / "more.md"))
    assert (as_path(copied.info.artifact_uri) / "more.md").is_file()
    got = client.download_artifacts(run_id, "card.md", str(tmp_path / "got"))
    assert Path(got).read_text(encoding="utf-8") == "v1"
    assert _digest(original) == before["all"]
    # no location of the copy's store names the original any more
    with sqlite3.connect(copy / "mlflow.db") as con:
        for table, column in LOCATIONS:
            rows = con.execute(f"SELECT {column} FROM {table}").fetchall()
            assert not [v for (v,) in rows if v and str(original) in v], (table, column)
    # opening it again (or the original) changes nothing
    shutil.copy(copy / "mlflow.db", tmp_path / "once.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _artifact_repos_cache.clear()
    runs.connect(cfg.tracking, Paths(copy))
    assert (copy / "mlflow.db").read_bytes() == (tmp_path / "once.db").read_bytes()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs.connect(cfg.tracking, Paths(original))
    assert _digest(original) == before["all"]
