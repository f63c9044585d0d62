"""The adaptation pretrain trains: fixed by params.yaml, or the arm the adapt stage chose (``data/adapt/chosen.json``).

An arm is a way to spend adaptation minutes, written as ``pretrain`` settings (:data:`ARM_PRETRAIN`); ``none``
spends them on fine-tuning instead. The tournament that chooses is :mod:`pipeline.training.tournament`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.io import SEAL_FILE, file_digest, read_report
from pipeline.core.paths import Paths
from pipeline.core.sections.pretrain import PretrainConfig

CHOSEN_FILE = "chosen.json"
# each adaptation arm as pretrain settings (the masked-LM arms keep pretrain.objective as it is); none pretrains nothing
ARM_PRETRAIN: dict[str, dict[str, Any]] = {
    "dapt": {"task_text": False, "corpus_text": True},
    "tapt": {"task_text": True, "corpus_text": False},
    "dapt+tapt": {"task_text": True, "corpus_text": True},
    # the selection's k, embedder and batch stay pretrain.selection's (the select stage computed it with them)
    "nearest+tapt": {"task_text": True, "corpus_text": True, "selection": {"mode": "nearest"}},
    "contrastive": {"objective": "simcse", "task_text": False, "corpus_text": True},
}


@dataclass(frozen=True)
class ChosenArm:
    """The adaptation the pretrain stage trains in full: an arm and its pretrain settings, and why it was chosen."""

    name: str
    pretrain: dict[str, Any]
    reason: str


def with_pretrain(cfg: Config, updates: dict[str, Any]) -> Config:
    """``cfg`` with ``pretrain.<key>: value`` for each of ``updates``, validated again; a mapping value updates that
    section's keys (``{"selection": {"mode": "nearest"}}`` keeps its ``k``)."""
    data = cfg.pretrain.model_dump(mode="python")
    for key, value in updates.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    pc = PretrainConfig.model_validate(data)
    return cfg.model_copy(update={"pretrain": pc})


def choice_digest(cfg: Config, paths: Paths) -> str:
    """What a choice holds for: the adapt and pretrain settings, seed, precision and the tokenized data (its seal:
    the SHA-256 of every file); pretrain refuses a choice made under others."""
    payload = {
        "tournament": cfg.adapt.model_dump(mode="json"),
        "pretraining": cfg.pretrain.model_dump(mode="json"),
        "seed": cfg.seed,
        "precision": cfg.precision,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    seal = paths.tokenized / SEAL_FILE
    digest.update(seal.read_bytes() if seal.exists() else paths.tokenize_report.read_bytes())
    blocks = paths.selection / "blocks.npy"
    if cfg.adapt.needs_selection() and blocks.exists():  # the kNN-TAPT arm trained on the select stage's blocks
        digest.update(file_digest(blocks).encode())
    return digest.hexdigest()[:16]


def chosen_adaptation(cfg: Config, paths: Paths) -> tuple[Config, ChosenArm | None]:
    """The configuration pretrain trains with: params.yaml under ``adapt.strategy: fixed`` (and ``None``); under
    ``auto`` the arm the adapt stage chose, its settings applied. A choice made under other settings is refused."""
    if cfg.adapt.strategy == "fixed":
        return cfg, None
    path = paths.adapt / CHOSEN_FILE
    record = read_report(path)
    if record.get("digest") != choice_digest(cfg, paths):
        raise DataError(
            path,
            None,
            "stale-adaptation",
            "it was chosen under other adapt or pretrain settings or other data than now: run the adapt stage "
            "again (dvc repro adapt)",
        )
    arm = record.get("arm")
    if arm != "none" and arm not in ARM_PRETRAIN:
        raise DataError(path, None, "bad-adaptation", f"arm {arm!r} is not one of {['none', *ARM_PRETRAIN]}")
    chosen = ChosenArm(arm, ARM_PRETRAIN.get(arm, {}), str(record.get("reason", "")))
    return (with_pretrain(cfg, chosen.pretrain) if chosen.pretrain else cfg), chosen
