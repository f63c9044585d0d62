"""`python -m pipeline plots` before anything ran: a clear error, not a blank page (the page itself: the e2e test)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.core.errors import Failure
from pipeline.core.paths import Paths
from pipeline.reporting.offline_plots import curve_files, write_offline_plots
from tests.conftest import ROOT


def test_the_curves_are_the_files_dvc_yaml_plots() -> None:
    assert curve_files(ROOT / "dvc.yaml") == [
        "reports/pretrain/train.csv",
        "reports/pretrain/eval.csv",
        "reports/finetune/adapted/train.csv",
        "reports/finetune/baseline/train.csv",
        "reports/finetune/adapted/dev.csv",
        "reports/finetune/baseline/dev.csv",
    ]


def test_no_curve_yet_names_the_files_and_what_to_run(tmp_path: Path) -> None:
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    with pytest.raises(Failure, match=r"no curves to plot yet \(reports/pretrain/train.csv, .*\): run dvc repro first"):
        write_offline_plots(Paths(tmp_path), tmp_path / "plots")
    assert not (tmp_path / "plots").exists()
