"""Fixtures the model tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.config import Config
from pipeline.core.paths import Paths
from pipeline.stages import tokenize
from tests.conftest import copy_project


@pytest.fixture(scope="session")
def tokenized_demo(built_demo: tuple[Config, Paths], tmp_path_factory: pytest.TempPathFactory) -> Paths:
    """The small demo project (validated by ``built_demo``) tokenized with word ids, once per session: copy before
    changing."""
    cfg, src = built_demo
    paths = copy_project(src, tmp_path_factory.mktemp("tokenized_demo"))
    tokenize.run(cfg, paths)
    return paths


@pytest.fixture
def ready(tokenized_demo: Paths, tmp_path: Path) -> Paths:
    """A private copy of the tokenized demo project, ready to pretrain (was: validate and tokenize again for each
    test, 64 CPU-seconds in CI's first 16 minutes)."""
    return copy_project(tokenized_demo, tmp_path)
