"""The blocks pretraining reads: the corpus's packed train blocks (all, or those the select stage chose), the tasks'
train inputs as TAPT text, and the validation blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.core.errors import DataError
from pipeline.core.io import missing_input, require_inputs
from pipeline.core.paths import Paths
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.modelling.shards import TASK_TEXT, has_group, open_group


@dataclass
class Blocks:
    """What pretraining reads: the train blocks (corpus, selected, plus TAPT text) and the validation blocks."""

    train: Any
    valid: Any
    block_len: int
    task_blocks: int  # of the train blocks, the tasks' train inputs (TAPT)
    selection: dict[str, Any] | None  # what the select stage chose (pretrain.selection.mode: nearest)
    shard_sizes: list[int]  # rows of each shard of ``train``, in order (the stream reads shard by shard)


def train_groups(pc: PretrainConfig) -> list[str]:
    """The shard groups pretraining trains on: corpus blocks (or sentence pairs), and the tasks' text for TAPT."""
    corpus = ["train" if pc.sentence_objective == "none" else "train_pairs"] if pc.corpus_text else []
    return [*corpus, *([TASK_TEXT] if pc.task_text else [])]


def load_blocks(pc: PretrainConfig, paths: Paths) -> Blocks:
    """The tokenize stage's block shards as ``pretrain`` asks for them, memory-mapped; a missing or stale input names
    its stage."""
    from datasets import concatenate_datasets

    tokenized = paths.pretrain_blocks
    train, shard_sizes = open_group(tokenized, "train")
    valid, _ = open_group(tokenized, "validation")
    block_len = len(train[0]["input_ids"])
    if pc.sentence_objective != "none":
        if not has_group(tokenized, "train_pairs"):  # tokenize.sentence_pairs is true (config.py checks it): older
            raise missing_input(tokenized / "train_pairs", "no sentence pairs")
        train, shard_sizes = open_group(tokenized, "train_pairs")
    selection = None
    if pc.selection.mode == "nearest":  # kNN-TAPT: only the corpus blocks the select stage chose
        train, selection = selected_blocks(train, paths)
        shard_sizes = [len(train)]  # the chosen blocks, in the select stage's order, are read as one shard
    task_blocks = 0
    if pc.task_text:  # DAPT+TAPT: the tasks' unlabelled train inputs join the corpus blocks (as their own shard)
        task_text, _ = open_group(tokenized, TASK_TEXT)
        task_blocks = len(task_text)
        if not pc.corpus_text:  # TAPT: the tasks' inputs alone (the corpus's validation blocks still evaluate)
            train, shard_sizes = task_text, [task_blocks]
        else:
            train = concatenate_datasets([train, task_text])
            shard_sizes = [*shard_sizes, task_blocks]
    if pc.masking != "token" and "word_ids" not in train.column_names:  # tokenize.whole_word is true: older outputs
        raise missing_input(tokenized / "train", "blocks without word ids")
    if len(valid) == 0:
        raise DataError(tokenized / "validation", None, "no-documents", "no validation blocks to evaluate on")
    return Blocks(train, valid, block_len, task_blocks, selection, shard_sizes)


def selected_blocks(train: Any, paths: Paths) -> tuple[Any, dict[str, Any]]:
    """The corpus blocks the select stage chose (``data/selection/``), and what the report says of them."""
    import numpy as np

    record_file, blocks_file = paths.selection / "selection.json", paths.selection / "blocks.npy"
    require_inputs(record_file, blocks_file)
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if record.get("mode") != "nearest" or record.get("corpus_blocks") != len(train):
        raise DataError(
            paths.selection,
            None,
            "stale-selection",
            f"it was made for {record.get('corpus_blocks')} blocks in mode {record.get('mode')}, the corpus has "
            f"{len(train)} and pretrain.selection.mode is nearest: run the select stage (dvc repro select)",
        )
    index = np.load(blocks_file)
    shown = {"mode": "nearest", "k": record["k"], "corpus_blocks": len(train), "selected_blocks": len(index)}
    return train.select(index.tolist()), shown
