"""Output helpers that never leave a half-written result in place of a good one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a fresh temporary directory that replaces ``target`` only if the block succeeds.

    The temporary directory sits next to ``target`` (same filesystem, so the final rename is
    atomic); on any exception it is deleted and ``target`` is left exactly as it was.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) through a temporary file and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON through a temporary file and an atomic rename."""
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n")


def data_digest(dirs: list[Path]) -> str:
    """SHA-256 over the names and bytes of every file below ``dirs`` (streamed, 1 MiB at a time)."""
    digest = hashlib.sha256()
    for d in dirs:
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            digest.update(str(f.relative_to(d.parent)).encode())
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()
