"""The MLflow UI opens on the runs, not on MLflow 3's GenAI views, from every address adaptbert writes and from the
README's (headless Chromium against a real ``mlflow server``; marked slow)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.core.mlflow_ui import mlflow_ui_page
from pipeline.core.paths import Paths
from pipeline.tracking import runs as tracking
from tests.conftest import ROOT, make_config, needs_environment
from tests.e2e.test_report import chromium

pytestmark = [
    pytest.mark.slow,
    needs_environment(chromium() is not None, "no headless Chromium here (.ci/run installs the Debian package)"),
]
GENAI_MARKERS = ("workflowType=genai", "Detect issues")  # the GenAI side bar's links, its traces pop-up


def _open(url: str) -> tuple[str, str]:
    """The page's title and DOM after its scripts ran (a fresh browser profile: no earlier choice of workflow)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000", "--dump-dom"]
    dom = subprocess.run([chromium(), *flags, url], capture_output=True, text=True, timeout=180).stdout
    title = re.search(r"<title>(.*?)</title>", dom)
    return (title.group(1) if title else ""), dom


def test_every_address_we_write_opens_the_machine_learning_pages(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    paths = Paths(tmp_path)
    client, experiment = tracking.connect(make_config(**{"tracking.experiment": "ui-check"}).tracking, paths)
    run = client.create_run(experiment).info.run_id
    (tmp_path / "index.html").write_text("<html><title>adaptbert run report</title></html>", encoding="utf-8")
    MlflowClient(mlflow_server).log_artifact(run, str(tmp_path / "index.html"), "report")
    client.set_terminated(run)
    pages = {
        "experiment": (mlflow_ui_page(f"experiments/{experiment}", mlflow_server), "Runs - "),
        "run": (tracking.run_page(paths, run), f"Run {run}"),
        "run report (the Prefect link)": (tracking.run_page(paths, run, "report/index.html"), f"Run {run}"),
    }
    for name, (url, title) in pages.items():
        seen, dom = _open(url)
        assert seen.startswith(title), f"{name}: {url} opened '{seen}'"
        assert not any(marker in dom for marker in GENAI_MARKERS), f"{name}: {url} shows GenAI views"


def test_the_readme_address_opens_the_runs_table(mlflow_server: str) -> None:
    from mlflow import MlflowClient

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (address,) = set(re.findall(r"http://127\.0\.0\.1:5000/#/\S+?(?=[\s)`])", readme))
    from mlflow.exceptions import MlflowException

    number = re.search(r"experiments/(\d+)", address)
    assert number, f"the README's MLflow address names no experiment: {address}"
    client = MlflowClient(mlflow_server)
    while True:  # the store holds an experiment of that id (a fresh project's first is 1: 0 is MLflow's Default)
        try:
            client.get_experiment(number.group(1))
            break
        except MlflowException:
            client.create_experiment(f"readme-{len(client.search_experiments(view_type=3))}")
    seen, dom = _open(address.replace("http://127.0.0.1:5000", mlflow_server))
    assert seen.startswith("Runs - ") and not any(marker in dom for marker in GENAI_MARKERS), (address, seen)
