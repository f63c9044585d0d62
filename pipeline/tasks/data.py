"""The tokenized tasks a model is trained and scored on: spec, feature splits and gold rows."""

from __future__ import annotations

import json
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

    from pipeline.modelling.multitask import TaskData
    from pipeline.tasks.base import TaskSpec
    from pipeline.tasks.registry import kind_of

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
    from pipeline.modelling.multitask import load_multitask

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
