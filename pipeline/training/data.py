"""The tokenized tasks a model is trained and scored on: spec, feature splits and gold rows."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.paths import Paths
from pipeline.core.sections.base import SPLITS


def load_tasks(cfg: Config, paths: Paths, tokenized: Path) -> dict[str, Any]:
    """Every task in ``tokenized/tasks.json``: its spec, tokenized splits and gold rows."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    from pipeline.tasks.registry import kind_of
    from pipeline.tasks.spec import TaskSpec
    from pipeline.training.multitask import TaskData

    index = tokenized / "tasks.json"
    tasks: dict[str, TaskData] = {}
    for meta in json.loads(index.read_text(encoding="utf-8")):
        name = meta["name"]
        kind_of(meta["type"], str(index))
        splits = {s: Dataset.from_file(str(tokenized / name / f"{s}.arrow")) for s in SPLITS}
        for split, features in splits.items():
            if len(features) == 0:
                raise DataError(
                    tokenized / name / f"{split}.arrow",
                    None,
                    "empty-split",
                    f"task '{name}' has no {split} examples: every task needs train, validation and test examples "
                    f"(check ingest.tasks[].files.{split} and reports/ingest.json)",
                )
        rows = {s: pq.read_table(paths.tasks / name / f"{s}.parquet").to_pylist() for s in SPLITS}
        tasks[name] = TaskData(
            TaskSpec(name, meta["type"], list(meta["labels"]), cfg.finetune.task(name)), splits, rows
        )
    if not tasks:
        raise DataError(index, None, "no-tasks", "no tasks to fine-tune: declare at least one under ingest.tasks")
    return tasks


def load_contender(model_dir: Path, cfg: Config, paths: Paths, tokenized: Path) -> tuple[Any, Any, dict[str, Any]]:
    """A saved multi-task model with its test data; its heads must fit the current label maps."""
    from pipeline.training.multitask import load_multitask

    if not (model_dir / "tasks.json").exists():
        raise DataError(
            model_dir, None, "missing-model", f"no fine-tuned model in {model_dir}: run the finetune stage first"
        )
    model, tok = load_multitask(model_dir)
    tasks = load_tasks(cfg, paths, tokenized)
    for name, data in tasks.items():
        spec = model.specs.get(name)
        if spec is None or spec.labels != data.spec.labels:
            have = "no head" if spec is None else f"labels {spec.labels}"
            raise DataError(
                model_dir / "tasks.json",
                None,
                "head-mismatch",
                f"task '{name}': the model has {have} but the data has labels {data.spec.labels}; re-run finetune",
            )
        data.spec = spec  # decode with the settings the model was trained with (n_best, ...)
    return model, tok, tasks


def train_subset(task: Any, fraction: float, seed: int) -> Any:
    """``task`` (a TaskData) with a seeded ``fraction`` of its train examples, for label-efficiency studies.

    Whole examples are kept or dropped (an extractive-QA example's windows go together, by ``example_id``);
    at least one example stays. The examples come in the order of one seeded permutation per task, so a
    smaller fraction's subset is part of a larger one's at the same seed, and every encoder fine-tuned with
    that seed sees the same labels (paired comparisons). Validation and test stay whole, and so do the gold
    rows (only scoring and the trivial baselines read them).
    """
    import dataclasses

    import numpy as np

    if not 0 < fraction <= 1:
        raise ValueError(f"fraction {fraction}: must be in (0, 1]")
    if fraction == 1:
        return task
    features = task.splits["train"]
    ids = features["example_id"] if "example_id" in features.column_names else list(range(len(features)))
    examples = list(dict.fromkeys(ids))  # distinct, in file order
    # the task's name in the seed: each task draws its own subset (crc32: stable across processes, unlike hash())
    rng = np.random.default_rng([seed, zlib.crc32(task.spec.name.encode())])
    keep = {examples[i] for i in rng.permutation(len(examples))[: max(1, round(fraction * len(examples)))]}
    rows = [i for i, x in enumerate(ids) if x in keep]
    # flattened in memory: readers of the Arrow columns (feature_lengths) see the subset, not the whole file
    subset = features.select(rows, keep_in_memory=True).flatten_indices(keep_in_memory=True)
    return dataclasses.replace(task, splits={**task.splits, "train": subset})
