"""The run report (``reports/index.html``): self-contained, built from the stage reports, rendered in a real browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.stages import report
from tests.conftest import ROOT, needs_environment


def chromium() -> str | None:
    """Headless Chromium (the Debian package ``chromium``, which ``.ci/run`` installs), if this machine has it."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture
def run_report(tmp_path: Path) -> Path:
    """The report stage over a copy of the committed default run's reports."""
    shutil.copytree(ROOT / "reports", tmp_path / "reports")
    result = report.run(None, Paths(tmp_path))  # the stage reads no params
    # register's promotion.json is not versioned (it names this machine's registry): the page has no section of it
    assert {"ingest", "validate", "tokenize", "pretrain", "evaluate", "compress"} <= set(result["stages"])
    return tmp_path / "reports" / "index.html"


def test_the_page_is_self_contained(run_report: Path) -> None:
    html = run_report.read_text(encoding="utf-8")
    assert not re.search(r"<(img|script|link|iframe)[^>]+(src|href)=\"(https?:)?//", html)  # nothing from a CDN
    assert not re.search(r"<img[^>]+src=\"(?!data:image/png;base64,)", html)  # every image embedded
    assert html.count("<img ") >= 5  # the pretraining curve, the evaluation plots, the compression front
    assert 'href="data_docs/index.html"' in html  # the Data Docs, beside it in reports/


def test_the_headline_is_a_verdict_and_the_perplexity_is_not_a_false_gain(run_report: Path) -> None:
    from html import escape

    from pipeline.core.reports.evaluation import EvaluationReport
    from pipeline.reporting.headline import verdict_and_watch

    html = run_report.read_text(encoding="utf-8")
    metrics = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
    headline = html[html.index("<h2>Headline</h2>") : html.index("</section>", html.index("<h2>Headline</h2>"))]
    said = verdict_and_watch(metrics)  # the gain with its CIs, how many tasks clear 0, the red flags
    assert said and all(escape(line) in headline for line in said)
    assert "ships no MLM head" in headline and "&rarr;" not in html.split("<h2>Continued pretraining</h2>")[1][:600]


def test_the_data_table_and_the_attention_maps_read_well(run_report: Path) -> None:
    """Was: "0" labels for QA (a type without labels) and four attention maps (three heatmaps each) per row."""
    html = run_report.read_text(encoding="utf-8")
    qa = re.search(r"<tr><td>qa</td><td>extractive_qa</td>(.*?)</tr>", html).group(1)
    assert qa.endswith("<td>-</td>")
    attention = html[html.index("<h2>What the models attend to</h2>") :]
    assert '<div class="plots wide">' in attention.split("</section>")[0] and ".wide figure{flex-basis:100%}" in html


def test_a_run_that_stopped_early_gets_the_sections_it_has(tmp_path: Path) -> None:
    (tmp_path / "reports").mkdir()
    shutil.copy(ROOT / "reports" / "ingest.json", tmp_path / "reports")
    result = report.run(None, Paths(tmp_path))
    html = (tmp_path / "reports" / "index.html").read_text(encoding="utf-8")
    assert result["stages"] == ["ingest"] and "<h2>Data</h2>" in html
    assert "evaluate has not run yet" in html and "<h2>Evaluation" not in html


@needs_environment(chromium() is not None, "no headless Chromium here (.ci/run installs the Debian package)")
def test_the_page_renders_in_headless_chromium(run_report: Path, tmp_path: Path) -> None:
    """Rendered content, not just a file: the title, the evaluation table with every task, decoded non-blank images."""
    import matplotlib.image

    url = run_report.resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=10000"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "<title>adaptbert run report</title>" in dom
    evaluation = dom[dom.index("Evaluation (test split)") :]
    rows = re.findall(r"<tr><td>(\w+)</td><td>(\w+)</td>", evaluation.split("</table>")[0])
    assert [task for task, _ in rows] == ["ner", "pair", "qa", "role"]
    loaded, total = map(int, re.search(r'data-images="(\d+)/(\d+)"', dom).groups())  # set by the page on load
    assert total >= 5 and loaded == total  # every embedded PNG decoded with a width
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium(), *flags, "--window-size=1200,2600", f"--screenshot={shot}", url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2600, 1200)
    header = pixels[10:90, 10:1190]  # the dark title bar
    assert header.mean() < 0.4
    rows_with_content = (pixels.std(axis=(1, 2)) > 0.05).mean()
    assert rows_with_content > 0.3  # text, tables and plots down the page (0.48 in 2,600 px), not a blank sheet (~0)
    for png in re.findall(r'src="data:image/png;base64,([^"]+)"', run_report.read_text(encoding="utf-8")):
        import base64
        import io

        image = matplotlib.image.imread(io.BytesIO(base64.b64decode(png)), format="png")
        assert np.asarray(image)[..., :3].std() > 0.01  # a plot, not an empty canvas


def test_the_settings_search_chose_are_shown_with_every_trial(tmp_path: Path) -> None:
    import json

    shutil.copytree(ROOT / "reports", tmp_path / "reports")
    trial = {"values": {"finetune.learning_rate": 2e-4, "finetune.max_steps": 300}, "steps": 300, "seconds": 61.0}
    search = {
        "enabled": True,
        "models": {
            "adapted": {
                "chosen": trial["values"],
                "chosen_trial": 1,
                "chosen_dev_mean_primary": 0.871,
                "default_dev_mean_primary": 0.85,
                "seconds": 130.0,
                "trials": [
                    {**trial, "trial": 0, "state": "complete", "dev_mean_primary": 0.85},
                    {**trial, "trial": 1, "state": "complete", "dev_mean_primary": 0.871},
                    {**trial, "trial": 2, "state": "pruned", "dev_mean_primary": 0.6},
                ],
            }
        },
    }
    (tmp_path / "reports" / "search.json").write_text(json.dumps(search))
    assert "search" in report.run(None, Paths(tmp_path))["stages"]
    html = (tmp_path / "reports" / "index.html").read_text(encoding="utf-8")
    section = html[html.index("<h2>Fine-tuning settings chosen on dev</h2>") :]
    assert (
        "87.1 with the chosen settings, 85.0 with params.yaml" in section
        and "learning_rate=0.0002, max_steps=300<" in section
    )
    assert "complete (chosen)" in section and section.count("<tr>") >= 4 and "pruned" in section
    (tmp_path / "reports" / "search.json").write_text(json.dumps({"enabled": False}))
    report.run(None, Paths(tmp_path))
    assert "chosen on dev</h2>" not in (tmp_path / "reports" / "index.html").read_text(encoding="utf-8")


def test_the_run_in_context_times_links_and_what_next(tmp_path: Path) -> None:
    """Was: no run time, hardware or profile; a link to the register stage's run only, an absolute store path, and
    nothing on what to do next."""
    from html import escape

    from pipeline.core.reports.compression import CompressionReport
    from pipeline.core.reports.evaluation import EvaluationReport
    from pipeline.reporting.html import render
    from tests.unit import typed_reports

    metrics = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
    reports: dict = {
        "metrics": metrics,
        "compression_report": read_report(ROOT / "reports" / "compression.json", CompressionReport),
    }
    promotion = typed_reports.promotion(
        model_name="adaptbert-smoke",
        profile="smoke",
        version="7",
        versions={"full": "7"},
        run_id="r1",
        parent_run_id="p1",
        experiment_id="3",
        tracking_uri="sqlite:////home/someone/project/mlflow.db",
        promoted=False,
        reason="does not beat it",
    )
    execution = {
        "parent_run_id": "p1",
        "stages": [
            {"stage": "finetune", "seconds": 125.4, "status": "FINISHED"},
            {"stage": "evaluate", "seconds": 20.0, "status": "FINISHED"},
            {"stage": "report", "seconds": None, "status": "RUNNING"},
        ],
    }
    empty = dict.fromkeys(["summary", "ingest_report", "validation_report", "tokenize_report", "search_report"])
    dirs = {"pretrain_curves": tmp_path, "plots": tmp_path, "compression": tmp_path}
    pretrain = read_report(ROOT / "reports" / "pretrain.json", PretrainReport)
    reports["pretrain_report"] = pretrain
    html = render({**empty, **reports, "promotion_report": promotion}, dirs, "abc", execution)
    assert "<h2>This run</h2>" in html and "Profile: <b>smoke</b>" in html
    assert escape(pretrain.precision_reason) in html  # the hardware and precision it chose
    assert "<td>finetune</td><td>2:05</td>" in html and "<b>2:25</b>" in html  # per stage and the total
    assert "#/experiments/3/runs/p1?workflowType=machine_learning" in html  # MLflow 3 opens it as ML, not GenAI
    assert "#/models/adaptbert-smoke/versions/7?workflowType=machine_learning" in html
    assert "--backend-store-uri sqlite:///mlflow.db" in html and "/home/someone" not in html
    assert "<h2>What next</h2>" in html and "adaptbert models card 7 --profile smoke" in html
    unclear = 4 - (metrics.summary.tasks_improved_significantly or 0)  # the committed run's, whatever it is
    assert "adaptbert models promote 7 --force" in html and f"CI includes 0 on {unclear} of 4 tasks" in html
    untracked = render({**empty, **reports, "promotion_report": promotion}, dirs, "abc", None)
    assert "tracking.enabled: false" in untracked and "#/experiments/3/runs/p1" in untracked  # from promotion.json
