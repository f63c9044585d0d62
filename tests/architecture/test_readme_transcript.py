"""The README's transcript and prose quote the committed run's reports, in the console's own words (issue 63, item 2):
a run whose reports are committed without the README brought along fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.core.config import load_config
from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.evaluation import EvaluationReport
from pipeline.reporting.evaluation import signed_interval
from pipeline.reporting.numbers import points
from pipeline.stages.evaluate import summary

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def transcript_of(stage: str) -> str:
    """The lines the README's transcript shows after ``> python -m pipeline <stage>`` and its ``...`` line."""
    found = re.search(rf"> python -m pipeline {stage}\n(?:\.\.\.\n)?(.*?)\n\n", README, re.S)
    assert found, f"README has no transcript of {stage}"
    return found.group(1)


def test_the_evaluate_transcript_is_what_the_committed_metrics_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the console names the reports relative to the project, as a run does
    metrics = read_report(ROOT / "reports" / "metrics.json", EvaluationReport)
    printed = "evaluate: " + summary(metrics, load_config(ROOT / "params.yaml"), Paths(Path(".")))
    shown = re.sub(r"\n  pretraining took [\d.]+ min this run$", "", transcript_of("evaluate"))  # a measurement
    assert shown == printed


def test_the_readme_prose_quotes_each_tasks_gain_as_the_committed_metrics_have_it() -> None:
    tasks = read_report(ROOT / "reports" / "metrics.json", EvaluationReport).tasks
    prose = README[README.index("**What adaptation buys on the demo**") :].split("\n\n")[0].replace("\n", " ")
    quoted = re.findall(r"`(\w+)`[^`\[]*?([+-]\d+\.\d \[[+-]\d+\.\d, [+-]\d+\.\d\])", prose)
    bare = re.findall(r"`(\w+)` ([+-]\d+\.\d)(?! \[)", prose)  # a gain quoted without its interval
    assert quoted and bare, "the README quotes no task's gain"
    for task, said in quoted:
        assert task in tasks and said == signed_interval(tasks[task]), (task, said)
    for task, said in bare:
        assert task in tasks and said == points(tasks[task].delta, signed=True), (task, said)
