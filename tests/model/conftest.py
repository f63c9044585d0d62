"""Fixtures the model tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipeline.core.config import Config
from pipeline.core.paths import Paths
from pipeline.stages import tokenize, validate


@pytest.fixture(scope="session")
def tokenized_demo(built_demo: tuple[Config, Paths], tmp_path_factory: pytest.TempPathFactory) -> Paths:
    """The small demo project validated and tokenized (with word ids), once per session: copy before changing."""
    cfg, src = built_demo
    paths = Paths(tmp_path_factory.mktemp("tokenized_demo"))
    for sub in ("data", "reports"):
        shutil.copytree(src.root / sub, paths.root / sub)
    validate.run(cfg, paths)
    tokenize.run(cfg, paths)
    return paths


@pytest.fixture
def ready(tokenized_demo: Paths, tmp_path: Path) -> Paths:
    """A private copy of the validated, tokenized demo project, ready to pretrain (was: validate and tokenize again
    for each test, 64 CPU-seconds in CI's first 16 minutes)."""
    for sub in ("data", "reports", "models"):  # models/tokenizer: tokenize's
        shutil.copytree(tokenized_demo.root / sub, tmp_path / sub)
    return Paths(tmp_path)
