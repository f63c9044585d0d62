"""Sharded pretraining inputs: Arrow IPC shards, one folder per group, and the manifest that lists them.

``data/tokenized/pretrain/``::

    manifest.json                 {"shards": [{"group", "file", "rows", "tokens", "sha256"}, ...]}
    train/part-00000.arrow ...    packed corpus blocks, one shard per corpus shard or ``tokenize.shard_docs`` documents
    validation/part-00000.arrow
    task_text/part-00000.arrow    the tasks' train inputs (TAPT)
    train_pairs/ ...              sentence pairs (tokenize.sentence_pairs)

A block shard packs a run of whole Parquet row groups of one corpus shard (:mod:`pipeline.text.corpus_shards`), so any
process (a Ray task, a torchrun rank) reads its input without reading the others. Pretraining memory-maps the shards it trains on
(:func:`open_group`): memory stays bounded whatever the corpus size.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.core.errors import DataError
from pipeline.core.io import check_digest, damaged_input, listed_file, missing_input, write_json
from pipeline.text.corpus_shards import corpus_shards

MANIFEST = "manifest.json"
CORPUS_GROUPS = ("train", "validation")
TASK_TEXT = "task_text"


@dataclass(frozen=True)
class ShardJob:
    """One shard to write: ``kind`` blocks or pairs of corpus split ``split``, from row groups ``row_groups`` of the
    corpus shard ``corpus_file`` (``None``: an empty split, an empty shard)."""

    kind: str  # "blocks" | "pairs"
    split: str
    index: int
    corpus_file: str | None  # relative to data/corpus/
    row_groups: list[int]

    @property
    def group(self) -> str:
        return self.split if self.kind == "blocks" else f"{self.split}_pairs"

    @property
    def file(self) -> str:
        return shard_file(self.group, self.index)


@dataclass(frozen=True)
class ShardRecord:
    """A manifest line: the shard's file (relative to the manifest), its rows, tokens and content hash."""

    group: str
    file: str
    rows: int
    tokens: int
    sha256: str


def shard_file(group: str, index: int) -> str:
    return f"{group}/part-{index:05d}.arrow"


def corpus_shard_plan(corpus_dir: Path, split: str, shard_docs: int) -> list[tuple[str | None, list[int]]]:
    """Per shard to write, ``(corpus shard, its row groups)``: each corpus shard of ``split`` (read order) with its
    row groups cut into runs of at least ``shard_docs`` documents (whole row groups, in order; the last run may be
    shorter). An empty split is one shard with no corpus file (an empty shard)."""
    import pyarrow.parquet as pq

    plan: list[tuple[str | None, list[int]]] = []
    for shard in corpus_shards(corpus_dir, split):
        meta = pq.ParquetFile(corpus_dir / shard.file).metadata
        runs: list[list[int]] = [[]]
        docs = 0
        for group in range(meta.num_row_groups):
            if docs >= shard_docs:
                runs.append([])
                docs = 0
            runs[-1].append(group)
            docs += meta.row_group(group).num_rows
        plan.extend((shard.file, run) for run in runs)
    return plan or [(None, [])]


def write_manifest(root: Path, records: list[ShardRecord]) -> None:
    """``root/manifest.json``: every shard, by group then index."""
    ordered = sorted(records, key=lambda r: (r.group, r.file))
    write_json(root / MANIFEST, {"shards": [asdict(r) for r in ordered]})


def read_manifest(root: Path) -> list[ShardRecord]:
    """The shards ``root/manifest.json`` lists; missing or unreadable is a missing input naming the tokenize stage."""
    path = root / MANIFEST
    if not path.exists():
        raise missing_input(path, "missing (a failed or never-run tokenize, or outputs older than sharded blocks)")
    try:
        return [ShardRecord(**line) for line in json.loads(path.read_text(encoding="utf-8"))["shards"]]
    except (ValueError, KeyError, TypeError) as err:
        raise missing_input(path, f"not a complete shard manifest ({type(err).__name__}: {str(err)[:120]})") from None


def group_records(records: list[ShardRecord], group: str) -> list[ShardRecord]:
    return [r for r in records if r.group == group]


def has_group(root: Path, group: str) -> bool:
    return bool(group_records(read_manifest(root), group))


def open_group(root: Path, group: str) -> tuple[Any, list[int]]:
    """The group's shards memory-mapped as one ``datasets.Dataset`` (in shard order), and each shard's rows."""
    from datasets import Dataset, concatenate_datasets

    records = group_records(read_manifest(root), group)
    if not records:
        raise missing_input(root / group, f"no '{group}' shards in {MANIFEST}")
    parts = []
    for record in records:  # each file inside its group's folder, readable, and the content the manifest records
        file = listed_file(root, record.file, group, root / MANIFEST)
        try:
            parts.append(Dataset.from_file(str(file)))
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError: a shard cut short
            raise damaged_input(file, "corrupt-blocks", f"not a readable Arrow shard ({str(err)[:120]})") from None
        check_digest(file, record.sha256, root / MANIFEST)
    sizes = [len(p) for p in parts]
    if sizes != [r.rows for r in records]:
        raise DataError(
            root / MANIFEST,
            None,
            "stale-manifest",
            f"'{group}' shards hold {sizes} rows, it lists "
            f"{[r.rows for r in records]}: run the tokenize stage again (dvc repro tokenize)",
        )
    return (parts[0] if len(parts) == 1 else concatenate_datasets(parts)), sizes


def groups_digest(root: Path, groups: list[str]) -> str:
    """A digest of the listed groups' shard hashes (what a resumed run must train on again)."""
    digest = hashlib.sha256()
    for record in read_manifest(root):
        if record.group in groups:
            digest.update(f"{record.file}:{record.sha256}\n".encode())
    return digest.hexdigest()
