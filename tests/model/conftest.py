"""Fixtures the model tests share."""

from __future__ import annotations

import pytest

from pipeline.core.paths import Paths
from pipeline.stages import tokenize, validate


@pytest.fixture
def ready(project) -> Paths:
    """A small demo project validated and tokenized (with word ids), ready to pretrain."""
    cfg, paths = project
    validate.run(cfg, paths)
    tokenize.run(cfg, paths)
    return paths
