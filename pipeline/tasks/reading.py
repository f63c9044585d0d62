"""Every labelled task's files -> its normalised splits and ``task.json`` (the ingest stage's task half).

Each record goes through its type's ``normalize`` (:mod:`pipeline.tasks.registry`); a bad record is
handled by the stage's :class:`pipeline.text.readers.ErrorPolicy` (fail, or skip and count). Task data
is small and labelled: a split is read whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.errors import DataError
from pipeline.core.io import write_json
from pipeline.core.sections.base import SPLITS
from pipeline.tasks.base import Record
from pipeline.tasks.registry import kind_of
from pipeline.text.readers import ErrorPolicy, iter_records, resolve_paths
from pipeline.text.textnorm import NormalForm

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ingest import IngestConfig, TaskConfig


def normalize_task_record(
    task: TaskConfig, rec: dict[str, Any], path: Path, line: int, form: NormalForm
) -> dict[str, Any]:
    """One task record in the normalised schema of its task type."""
    return kind_of(task.type).normalize(Record(rec, task.field, path, line, form))


def read_task_split(
    task: TaskConfig, split: str, cfg: IngestConfig, policy: ErrorPolicy, root: Path
) -> list[dict[str, Any]]:
    """All normalised records of one split, each with ``id``, ``source_file`` and ``source_line``."""
    rows: list[dict[str, Any]] = []
    kind = kind_of(task.type)
    fields = list(dict.fromkeys(task.field(k) for k in kind.fields if k not in kind.optional_fields))
    for path in resolve_paths(task.files[split], root):
        for line, rec in iter_records(
            path, task.format, policy, cfg.max_record_bytes, fields, csv_multiline=cfg.csv_multiline
        ):
            try:
                row = normalize_task_record(task, rec, path, line, cfg.unicode_form)
            except DataError as err:
                policy.handle(err)
                continue
            rows.append({"id": f"{split}-{len(rows):07d}", "source_file": str(path), "source_line": line, **row})
    return rows


def label_list(task: TaskConfig, train: list[dict[str, Any]]) -> tuple[list[str], str]:
    """The task's labels: from params if given, else frozen from the train split (none for unlabelled types)."""
    if task.labels is not None:
        return list(task.labels), "params"
    kind = kind_of(task.type)
    return (kind.label_list(train), "train") if kind.labelled else ([], "none")


def ingest_tasks(
    cfg: IngestConfig, out_dir: Path, policy: ErrorPolicy, root: Path
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Write every task's normalised splits and ``task.json``; return stats and the evaluation
    texts ``(task, split, text)`` that must not appear in the corpus."""
    stats: dict[str, Any] = {}
    leak: list[tuple[str, str, str]] = []
    for task in cfg.tasks:
        task_dir = out_dir / task.name
        task_dir.mkdir(parents=True)
        splits = {}
        for split in SPLITS:
            before = sum(policy.counts.values())
            splits[split] = read_task_split(task, split, cfg, policy, root)
            stats_split = {"examples": len(splits[split]), "skipped": sum(policy.counts.values()) - before}
            stats.setdefault(task.name, {"type": task.type, "splits": {}})["splits"][split] = stats_split
            pq.write_table(
                pa.Table.from_pylist(splits[split]) if splits[split] else pa.table({"id": pa.array([], pa.string())}),
                task_dir / f"{split}.parquet",
            )
        labels, labels_from = label_list(task, splits["train"])
        meta = {
            "name": task.name,
            "type": task.type,
            "labels": labels,
            "labels_from": labels_from,
            "files": dict(task.files),
            "examples": {s: len(splits[s]) for s in SPLITS},
        }
        write_json(task_dir / "task.json", meta)
        stats[task.name].update(labels=len(labels), labels_from=labels_from)
        for split in ("validation", "test"):
            leak.extend((task.name, split, t) for row in splits[split] for t in kind_of(task.type).leakage_texts(row))
    return stats, leak
