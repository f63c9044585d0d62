"""Shared fixtures: a small demo project built once per session in a temporary directory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline import demo, ingest
from pipeline.config import Config, load_config
from pipeline.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Small demo sizes: seconds, not minutes. Validation thresholds stay those of params.yaml.
SMALL: dict[str, Any] = {
    "demo.corpus_docs": 400, "demo.role_examples": 400, "demo.pair_examples": 300,
    "demo.ner_examples": 300, "demo.qa_examples": 200,
    "tokenize.extend_vocab.enabled": True,  # off by default; on here so tests cover the richer path (new rows, baseline vocab)
}


def make_config(**overrides: Any) -> Config:
    """The repository's params.yaml with the small demo sizes and ``{"a.b": v}`` overrides."""
    return load_config(ROOT / "params.yaml", {**SMALL, **overrides})


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Paths]:
    """demo + ingest once per session; tests copy it before changing anything."""
    paths = Paths(tmp_path_factory.mktemp("demo_project"))
    cfg = make_config()
    demo.run(cfg.demo, paths.demo)
    ingest.run(cfg, paths)
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

    from pipeline.config import _set_dotted, load_params

    data = load_params(ROOT / "params.yaml")
    for dotted, value in {**SMALL, **overrides}.items():
        _set_dotted(data, dotted, value)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# A tiny scratch BERT and a short run: seconds on CPU.
TINY_PRETRAIN: dict[str, Any] = {
    "pretrain.base_model": "scratch", "pretrain.scratch.hidden_size": 32, "pretrain.scratch.num_hidden_layers": 2,
    "pretrain.scratch.num_attention_heads": 2, "pretrain.scratch.intermediate_size": 64, "pretrain.max_steps": 6,
    "pretrain.micro_batch_size": 4, "pretrain.warmup_steps": 1, "pretrain.logging_steps": 1, "pretrain.eval_steps": 3,
    "pretrain.save_steps": 3, "pretrain.save_total_limit": 3, "pretrain.eval_max_blocks": 16, "pretrain.mlflow": False,
    "pretrain.learning_rate": 1e-3,
}

# A short multi-task run on that tiny model: seconds on CPU.
TINY_FINETUNE: dict[str, Any] = {
    "finetune.max_steps": 30, "finetune.batch_size": 8, "finetune.eval_steps": 10, "finetune.logging_steps": 5,
    "finetune.learning_rate": 1e-3, "finetune.mlflow": False, "evaluate.bootstrap_resamples": 200,
}


@pytest.fixture(scope="session")
def pretrained(built_demo: tuple[Config, Paths], tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Paths]:
    """The small demo project after tokenize and a tiny pretrain (once per session; copy before changing)."""
    from pipeline import pretrain, tokenize

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
