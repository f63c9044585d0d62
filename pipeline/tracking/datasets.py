"""The data a stage read, as MLflow dataset inputs: the corpus and every task split, each with its digest.

MLflow's runs table then fills its Dataset column, and a run's page lists what it trained or was scored on (name,
digest, where the file lies) next to its params. Datasets are logged by reference (``MetaDataset``: no copy, no
profile of the rows); the same bytes read by two runs show the same digest. Which stage reads what is its record's
``datasets`` (:mod:`pipeline.core.stages`).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from pipeline.core.paths import Paths
from pipeline.core.stages import NAMES, stage_record

SPLITS = ("train", "validation", "test")


def stage_datasets(stage: str, paths: Paths) -> list[tuple[str, Path, str, str]]:
    """``(name, file or folder, context, digest)`` of the ingested data ``stage`` reads (``corpus/train``,
    ``ner/test``, ...): a corpus split is its shard folder, digested from the shards' SHA-256 in the corpus manifest
    (no re-read of a corpus that may not fit in memory); a task split its Parquet file, digested by md5."""
    from pipeline.tracking.lineage import file_md5

    reads = stage_record(stage).datasets if stage in NAMES else ()
    corpus_splits = [d.split("/", 1)[1] for d in reads if d.startswith("corpus/")]
    task_splits = [d.split("/", 1)[1] for d in reads if d.startswith("tasks/")]
    found = []
    manifest = paths.corpus / "manifest.json"
    if corpus_splits and manifest.is_file():
        shards = json.loads(manifest.read_text(encoding="utf-8"))["shards"]
        for split in corpus_splits:
            sums = "".join(s["sha256"] for s in shards if s["split"] == split)
            if sums:
                digest = hashlib.sha256(sums.encode()).hexdigest()[:8]
                found.append((f"corpus/{split}", paths.corpus / split, split, digest))
    for meta in sorted(paths.tasks.glob("*/task.json")):
        for split in task_splits:
            if (file := meta.parent / f"{split}.parquet").is_file():
                found.append((f"{meta.parent.name}/{split}", file, split, file_md5(file)[:8]))
    return found


def dataset_inputs(stage: str, paths: Paths) -> list[Any]:
    """MLflow ``DatasetInput`` entities of :func:`stage_datasets` (the ``mlflow.data.context`` tag: the split)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    inputs = []
    for name, path, context, digest in stage_datasets(stage, paths):
        with warnings.catch_warnings():
            # MLflow 3 registers its local-file source class twice and then warns on every resolve that a path "can be
            # interpreted in multiple ways: LocalArtifactDatasetSource, LocalArtifactDatasetSource" (one class): noise
            # in every stage's console, no choice to make
            warnings.filterwarnings(
                "ignore", message="The specified dataset source can be interpreted in multiple ways"
            )
            source = resolve_dataset_source(str(path.resolve()))
        # MetaDataset is concrete at run time; its stub declares `profile` abstract (MLflow's own tests build it so)
        dataset = MetaDataset(source=source, name=name, digest=digest)  # type: ignore[abstract]
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), [InputTag("mlflow.data.context", context)]))
    return inputs


def log_datasets(client: Any, run_id: str, stage: str, paths: Paths) -> None:
    """Log what ``stage`` read as the run's dataset inputs (nothing for a stage that reads no ingested data)."""
    if inputs := dataset_inputs(stage, paths):
        client.log_inputs(run_id, datasets=inputs)
