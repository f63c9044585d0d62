"""Task rows -> model inputs for every split, as each task type encodes them, written as Arrow (tokenize stage)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.io import write_json
from pipeline.tasks.registry import kind_of

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.finetune import FinetuneTaskConfig
    from pipeline.core.sections.tokenize import TokenizeConfig


def task_train_inputs(tasks_dir: Path) -> Iterator[tuple[str, str]]:
    """``(task, text)`` for every distinct train input of every ingested task, the labels left out.

    Only train splits: task-adaptive pretraining and corpus selection must not read the texts they are
    evaluated on. A pair's two texts are one input (joined by a space).
    """
    for task_dir in sorted(p for p in tasks_dir.iterdir() if (p / "task.json").exists()):
        kind = kind_of(json.loads((task_dir / "task.json").read_text(encoding="utf-8"))["type"])
        rows = pq.read_table(task_dir / "train.parquet").to_pylist()
        for text in dict.fromkeys(" ".join(kind.input_texts(row)) for row in rows):  # an identical row once
            yield task_dir.name, text


def encode_task_split(
    tok: Any,
    meta: dict[str, Any],
    rows: list[dict[str, Any]],
    tc: TokenizeConfig,
    settings: FinetuneTaskConfig | None = None,
) -> dict[str, list[Any]]:
    """Model inputs for one task split, as its task type encodes them (windows of long texts where
    ``settings.long_text`` asks for them)."""
    kind = kind_of(meta["type"])
    if settings is not None and settings.long_text == "windows":
        return kind.encode_long(tok, rows, meta["labels"], tc, meta["name"], settings.max_windows)
    return kind.encode(tok, rows, meta["labels"], tc, meta["name"])


def tokenize_tasks(
    tok: Any, tasks_dir: Path, out_dir: Path, tc: TokenizeConfig, settings: dict[str, FinetuneTaskConfig]
) -> dict[str, Any]:
    """Every task split to ``<out_dir>/<task>/<split>.arrow``, plus ``tasks.json`` (``settings``: the
    tasks' fine-tuning settings, which say whether long texts become windows)."""
    stats: dict[str, Any] = {}
    metas = []
    for task_dir in sorted(p for p in tasks_dir.iterdir() if (p / "task.json").exists()):
        meta = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))
        metas.append(meta)
        (out_dir / meta["name"]).mkdir(parents=True)
        stats[meta["name"]] = {}
        for split in ("train", "validation", "test"):
            rows = pq.read_table(task_dir / f"{split}.parquet").to_pylist()
            task_settings = settings.get(meta["name"])
            cols = encode_task_split(tok, meta, rows, tc, task_settings) if rows else {"input_ids": []}
            table = pa.table(cols)
            with (
                pa.OSFile(str(out_dir / meta["name"] / f"{split}.arrow"), "wb") as sink,
                pa.ipc.new_stream(sink, table.schema) as w,
            ):
                w.write_table(table)
            stats[meta["name"]][split] = split_stats(cols, len(rows), kind_of(meta["type"]).windowed, tc, task_settings)
    write_json(out_dir / "tasks.json", metas)
    return stats


def split_stats(
    cols: dict[str, list[Any]], examples: int, windowed: bool, tc: TokenizeConfig, settings: FinetuneTaskConfig | None
) -> dict[str, Any]:
    """Examples, features, how many were cut (truncated, or more windows than ``max_windows``) and mean tokens."""
    if "window_count" in cols:  # long_text: windows: one row per example, a list of windows each
        lengths = [sum(len(w) for w in windows) for windows in cols["input_ids"]]
        assert settings is not None
        return {
            "examples": examples,
            "features": sum(len(w) for w in cols["input_ids"]),  # windows
            "truncated": sum(n > settings.max_windows for n in cols["window_count"]),
            "mean_tokens": round(float(np.mean(lengths)), 1) if lengths else 0.0,
        }
    lengths = [len(x) for x in cols["input_ids"]]
    return {
        "examples": examples,
        "features": len(lengths),
        "truncated": None if windowed else sum(n >= tc.max_seq_length for n in lengths),
        "mean_tokens": round(float(np.mean(lengths)), 1) if lengths else 0.0,
    }


def iter_task_text_batches(tasks_dir: Path, batch_docs: int) -> Iterator[list[str]]:
    """The labelled tasks' train inputs without their labels (one document per distinct input), in batches."""
    batch: list[str] = []
    for _, text in task_train_inputs(tasks_dir):
        batch.append(text)
        if len(batch) == batch_docs:
            yield batch
            batch = []
    if batch:
        yield batch
