"""Trainer checkpoints that survive crashes: find the newest usable one, set aside stale ones.

Shared by the pretrain and finetune stages. A checkpoint is resumed only if the run that wrote
it had the same fingerprint (params, seed, training code, input data); a checkpoint that does
not load is renamed ``*.corrupt`` and the previous one is used.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

from pipeline.core.io import write_json

REQUIRED_CHECKPOINT_FILES = ("trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt")


def fingerprint(digest: hashlib._Hash, code_files: list[Path], data_files: list[Path]) -> str:
    """Finish ``digest`` (already fed with params) with the code files and the head/tail of data files."""
    for f in code_files:
        digest.update(f.read_bytes())
    for f in data_files:
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
        with open(f, "rb") as fh:  # head and tail: enough to tell two outputs apart, O(1) in corpus size
            digest.update(fh.read(1 << 20))
            fh.seek(max(0, f.stat().st_size - (1 << 20)))
            digest.update(fh.read())
    return digest.hexdigest()


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why a checkpoint cannot be resumed from, or ``None`` if it loads."""
    import torch
    from safetensors.torch import load_file

    missing = [f for f in REQUIRED_CHECKPOINT_FILES if not (ckpt / f).exists()]
    if missing:
        return f"missing {missing}"
    try:
        json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
        load_file(ckpt / "model.safetensors")
        torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        torch.load(ckpt / "scheduler.pt", map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or garbled file raises anything from OSError to pickle errors
        return f"{type(err).__name__}: {str(err)[:120]}"
    return None


def usable_checkpoint(ckpt_dir: Path, log: list[str]) -> Path | None:
    """The newest checkpoint that loads; unusable ones are renamed ``*.corrupt`` and reported."""
    ckpts = sorted(
        (p for p in ckpt_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()),
        key=step_of,
        reverse=True,
    )
    for ckpt in ckpts:
        problem = checkpoint_problem(ckpt)
        if problem is None:
            return ckpt
        log.append(f"{ckpt.name} is unusable ({problem}); falling back to the previous checkpoint")
        ckpt.rename(ckpt.with_name(ckpt.name + ".corrupt"))
    return None


def prepare_checkpoints(
    ckpt_dir: Path, fingerprint: str, log: list[str], settings: dict[str, str] | None = None
) -> Path | None:
    """Resume point for this configuration; checkpoints of another one are moved aside.

    ``settings`` are resolved values that are part of the fingerprint but not of params.yaml
    (``precision: auto`` resolves per machine): when one of them changed, the log names it.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    marker = ckpt_dir / "run.json"
    settings = settings or {}
    if marker.exists() and (before := json.loads(marker.read_text()))["fingerprint"] != fingerprint:
        aside = ckpt_dir.parent / f"{ckpt_dir.name}.previous"
        shutil.rmtree(aside, ignore_errors=True)
        ckpt_dir.rename(aside)
        ckpt_dir.mkdir()
        old = before.get("settings", {})
        changed = [f"{k} {old[k]} -> {v}" for k, v in settings.items() if k in old and old[k] != v]
        what = (
            f"{', '.join(changed)} (checkpoints of one precision are not resumed in another)"
            if changed
            else "params, training code, data or tokenizer changed"
        )
        log.append(f"{what} since the checkpoints were written: moved them to {aside}, starting fresh")
    write_json(marker, {"fingerprint": fingerprint, "settings": settings})
    return usable_checkpoint(ckpt_dir, log)


def step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("-")[-1])


def copy_curves(src: Path, dst: Path) -> None:
    """The curve CSVs of ``src`` (logged during training, see :func:`keep_curves_until`) into ``dst`` (staged)."""
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.csv")) if src.is_dir() else []:
        shutil.copy2(path, dst / path.name)


def keep_curves_until(curves: Path, step: int) -> None:
    """Drop the rows after ``step`` from every curve CSV in the directory ``curves`` (those a resumed run will
    log again); all of them for a fresh run."""
    for path in sorted(curves.glob("*.csv")) if curves.is_dir() else []:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        kept = [rows[0]] + [r for r in rows[1:] if int(r[0]) <= step] if step and rows else []
        if len(kept) > 1:
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows(kept)
        else:
            path.unlink()
