"""Lineage: which code, data and models a run used and made, in the hashes DVC records.

Three sources, each right at a different moment:

- ``git.commit`` / ``git.dirty`` of the project;
- ``dvc.lock``, right about every stage that is not running now (DVC writes a stage's entry after it ran);
- the stage's own inputs and outputs, hashed here the way DVC hashes them (md5 of a file's bytes; for a
  directory the md5 of its sorted ``[{"md5", "relpath"}]`` listing + ``.dir``), so a stage run's
  ``dvc.in.<path>`` tags (at start) and ``dvc.out.<path>`` tags (after its outputs exist) equal what
  DVC then writes into ``dvc.lock`` for that stage.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.paths import Paths

IGNORED_DIRS = {"__pycache__"}  # .dvcignore: DVC hashes a directory without them
# libyaml's parser where PyYAML has it: dvc.lock (~70 kB) is read several times by every stage's tags, 0.2 s each
# with the pure-Python parser, 0.02 s with this one
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dvc_file_stages(path: Path) -> dict[str, Any]:
    """The ``stages`` mapping of a ``dvc.yaml`` or ``dvc.lock`` (empty when the file does not exist)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    return dict(_parsed_stages(str(path.resolve()), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=8)
def _parsed_stages(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """Parsed once per version of the file (its mtime and size are part of the key): a stage's tags read dvc.lock
    (~2,700 lines, 40 ms to parse) four to eight times. Callers only read the result."""
    data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_YAML_LOADER) or {}  # a SafeLoader: safe
    return dict(data.get("stages") or {})


def git_state(root: Path) -> dict[str, str]:
    """``git.commit`` and ``git.dirty`` of the project (``unknown`` outside a git repository).

    Dirty means uncommitted changes to tracked code or params; the pipeline's own outputs that git
    also tracks (``reports/``, ``dvc.lock``) change with every run and are covered by the ``dvc.*`` tags.
    """

    def git(*args: str) -> str | None:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git.commit": "unknown", "git.dirty": "unknown"}
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports", ":(exclude)dvc.lock")
    return {"git.commit": commit, "git.dirty": str(bool(dirty)).lower()}


def dvc_lock_hashes(root: Path) -> dict[str, str]:
    """``dvc.<stage>.<out path>`` -> content hash of every out recorded in ``dvc.lock``."""
    stages = dvc_file_stages(root / "dvc.lock")
    tags = {}
    for stage, entry in stages.items():
        for out in entry.get("outs", []):
            value = out.get("md5") or out.get(out.get("hash", ""), "")
            if value:
                tags[f"dvc.{stage}.{out['path']}"] = str(value)
    return tags


def data_hash(paths: Paths) -> dict[str, str]:
    """``data_hash``: of ingest's outs in ``dvc.lock`` (what ``dvc checkout`` restores); a project run outside
    DVC hashes the task files themselves."""
    from pipeline.core.io import data_digest

    ingest = sorted(v for k, v in dvc_lock_hashes(paths.root).items() if k.startswith("dvc.ingest."))
    if ingest:
        return {"data_hash": hashlib.sha256("\n".join(ingest).encode()).hexdigest()[:32]}
    return {"data_hash": data_digest([paths.tasks])[:32]} if paths.tasks.exists() else {}


def lineage_tags(paths: Paths) -> dict[str, str]:
    """Git commit and dirty flag, the ``dvc.lock`` hash of each stage's outs, and the data hash."""
    return {**git_state(paths.root), **dvc_lock_hashes(paths.root), **data_hash(paths)}


# ----------------------------------------------------------------------------- a stage's inputs and outputs


def file_md5(path: Path) -> str:
    """md5 of a file's bytes, streamed 1 MiB at a time (DVC 3's ``hash: md5``)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def dvc_md5(path: Path) -> str | None:
    """The md5 DVC records for ``path`` (``<md5>.dir`` for a directory); ``None`` when it does not exist."""
    if path.is_file():
        return file_md5(path)
    if not path.is_dir():
        return None
    entries = []
    for folder, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in IGNORED_DIRS]
        for name in files:
            full = Path(folder) / name
            if not full.is_file():  # a FIFO, socket or device: open() on a FIFO would wait forever for a writer
                continue
            entries.append({"md5": file_md5(full), "relpath": full.relative_to(path).as_posix()})
    entries.sort(key=lambda e: e["relpath"])
    listing = json.dumps(entries, sort_keys=True).encode("utf-8")
    return hashlib.md5(listing, usedforsecurity=False).hexdigest() + ".dir"


def stage_paths(root: Path, stage: str) -> tuple[list[str], list[str]]:
    """``(deps, outs)`` of ``stage`` as ``dvc.yaml`` declares them (outs include its metrics and plots)."""
    entry = dvc_file_stages(root / "dvc.yaml").get(stage, {})

    def names(items: list[Any]) -> list[str]:
        return [next(iter(i)) if isinstance(i, dict) else str(i) for i in items or []]

    outs = names(entry.get("outs", [])) + names(entry.get("metrics", [])) + names(entry.get("plots", []))
    return names(entry.get("deps", [])), outs


def io_tags(root: Path, kind: str, rel_paths: list[str]) -> dict[str, str]:
    """``dvc.<kind>.<path>`` -> DVC's md5 for each of ``rel_paths`` that exists (``kind``: ``in`` or ``out``)."""
    tags = {}
    for rel in rel_paths:
        value = dvc_md5(root / rel)
        if value is not None:
            tags[f"dvc.{kind}.{rel}"] = value
    return tags


def stage_input_tags(paths: Paths, stage: str) -> dict[str, str]:
    """Git state, the data hash and the hash of every input of ``stage``, as they are when it starts."""
    deps, _ = stage_paths(paths.root, stage)
    return {**git_state(paths.root), **data_hash(paths), **io_tags(paths.root, "in", deps)}


def stage_output_tags(paths: Paths, stage: str) -> dict[str, str]:
    """The hash of every output of ``stage`` (after it wrote them): what DVC is about to record in ``dvc.lock``."""
    _, outs = stage_paths(paths.root, stage)
    return io_tags(paths.root, "out", outs)
