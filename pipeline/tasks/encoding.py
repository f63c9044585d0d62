"""Task rows -> model inputs for every split, as each task type encodes them, written as Arrow (tokenize stage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.io import write_json
from pipeline.core.sections.tokenize import TokenizeConfig
from pipeline.tasks.registry import kind_of


def encode_task_split(
    tok: Any, meta: dict[str, Any], rows: list[dict[str, Any]], tc: TokenizeConfig
) -> dict[str, list[Any]]:
    """Model inputs for one task split, as its task type encodes them."""
    return kind_of(meta["type"]).encode(tok, rows, meta["labels"], tc, meta["name"])


def tokenize_tasks(tok: Any, tasks_dir: Path, out_dir: Path, tc: TokenizeConfig) -> dict[str, Any]:
    """Every task split to ``<out_dir>/<task>/<split>.arrow``, plus ``tasks.json``."""
    stats: dict[str, Any] = {}
    metas = []
    for task_dir in sorted(p for p in tasks_dir.iterdir() if (p / "task.json").exists()):
        meta = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))
        metas.append(meta)
        (out_dir / meta["name"]).mkdir(parents=True)
        stats[meta["name"]] = {}
        for split in ("train", "validation", "test"):
            rows = pq.read_table(task_dir / f"{split}.parquet").to_pylist()
            cols = encode_task_split(tok, meta, rows, tc) if rows else {"input_ids": []}
            table = pa.table(cols)
            with (
                pa.OSFile(str(out_dir / meta["name"] / f"{split}.arrow"), "wb") as sink,
                pa.ipc.new_stream(sink, table.schema) as w,
            ):
                w.write_table(table)
            lengths = [len(x) for x in cols["input_ids"]]
            stats[meta["name"]][split] = {
                "examples": len(rows),
                "features": len(lengths),
                "truncated": None if kind_of(meta["type"]).windowed else sum(n >= tc.max_seq_length for n in lengths),
                "mean_tokens": round(float(np.mean(lengths)), 1) if lengths else 0.0,
            }
    write_json(out_dir / "tasks.json", metas)
    return stats
