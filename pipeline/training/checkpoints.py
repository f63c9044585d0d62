"""Trainer checkpoints that survive crashes: find the newest usable one, set aside stale ones.

Shared by the pretrain and finetune stages. A checkpoint is resumed only if the run that wrote
it had the same fingerprint (params, seed, training code, input data); a checkpoint that does
not load, or whose weights are not the model's (a tensor missing, another shape or dtype: the
Trainer loads them non-strictly, so a missing layer would keep its fresh initialisation), is
renamed ``*.corrupt`` and the previous one is used.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class WeightsLayout:
    """What a checkpoint of one model must hold: each state-dict tensor's shape and dtype, and which names share
    one tensor (tied weights are saved under one of their names)."""

    tensors: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype name)
    storage: dict[str, str]  # name -> the first name of the tensor it shares (itself where not tied)
    # names whose shapes a check of their own compares (the task heads': a changed label count is named as such)
    shapes_elsewhere: tuple[str, ...] = ()

    def problem(self, weights: dict[str, Any]) -> str | None:
        """Why ``weights`` (a loaded state dict) are not this model's, or ``None``."""
        unknown = sorted(set(weights) - set(self.tensors))
        if unknown:
            return f"{len(unknown)} tensor(s) this model does not have, e.g. {unknown[0]}"
        for name, tensor in weights.items():
            found = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
            if self.shapes_elsewhere and name.startswith(self.shapes_elsewhere):
                found = (self.tensors[name][0], found[1])
            if found != self.tensors[name]:
                return f"{name} is {found[1]} {list(found[0])}, the model's is {self.tensors[name][1]} {list(self.tensors[name][0])}"
        missing = sorted(set(self.storage.values()) - {self.storage[name] for name in weights})
        if missing:
            return f"{len(missing)} of the model's tensors missing, e.g. {missing[0]}"
        return None


def weights_layout(model: Any, shapes_elsewhere: tuple[str, ...] = ()) -> WeightsLayout:
    """The :class:`WeightsLayout` of ``model`` as it is now (before training: its fp32 weights, which are what every
    checkpoint holds, fp32 masters included); ``shapes_elsewhere``: name prefixes whose shapes are not compared."""
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    storage: dict[str, str] = {}
    first: dict[tuple[int, int], str] = {}
    for name, tensor in model.state_dict().items():
        tensors[name] = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        storage[name] = first.setdefault(key, name) if key[0] else name
    return WeightsLayout(tensors, storage, shapes_elsewhere)


def checkpoint_problem(ckpt: Path, layout: WeightsLayout | None = None) -> str | None:
    """Why a checkpoint cannot be resumed from (naming the file), or ``None`` if every file loads (the weights fit
    ``layout`` where given; the RNG states load as the Trainer loads them, without unpickling code)."""
    import torch
    from safetensors.torch import load_file
    from transformers.trainer_pt_utils import safe_globals

    missing = [f for f in REQUIRED_CHECKPOINT_FILES if not (ckpt / f).exists()]
    if missing:
        return f"missing {missing}"

    def load_weights(path: Path) -> str | None:
        weights = load_file(path)
        return layout.problem(weights) if layout else None

    def load_rng(path: Path) -> None:
        with safe_globals():  # numpy's arrays allowed, as transformers' Trainer._load_rng_state does
            torch.load(path, map_location="cpu", weights_only=True)

    loaders: dict[str, Any] = {
        "trainer_state.json": lambda path: trainer_state_problem(path, step_of(ckpt)),
        "model.safetensors": load_weights,
        "optimizer.pt": lambda path: torch.load(path, map_location="cpu", weights_only=True),
        "scheduler.pt": lambda path: torch.load(path, map_location="cpu", weights_only=True),
    }
    loaders |= {path.name: load_rng for path in sorted(ckpt.glob("rng_state*.pth"))}
    for name, load in loaders.items():
        try:
            problem = load(ckpt / name)
        except Exception as err:  # a truncated or garbled file raises anything from OSError to pickle errors
            problem = f"{type(err).__name__}: {str(err)[:120]}"
        if isinstance(problem, str):
            return f"{name}: {problem}"
    return None


def restore_weights(model: Any, ckpt: Path) -> None:
    """Load the weights of checkpoint ``ckpt`` into ``model``, all of them: a file that does not fit the model is
    ``[corrupt-checkpoint]`` naming it (transformers loads non-strictly: a missing tensor would keep its value)."""
    from safetensors.torch import load_file

    from pipeline.core.errors import DataError

    path = ckpt / "model.safetensors"
    try:
        weights = load_file(path)
    except Exception as err:  # truncated or garbled: safetensors raises its own errors or OSError
        weights, problem = {}, f"unreadable ({type(err).__name__}: {str(err)[:120]})"
    else:
        problem = weights_layout(model).problem(weights)
    if problem:
        raise DataError(path, None, "corrupt-checkpoint", f"{problem}: delete {ckpt} and re-run the stage")
    model.load_state_dict(weights, strict=False)  # the tied names the file leaves out share a tensor it holds
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def trainer_state_problem(path: Path, step: int) -> str | None:
    """Why ``trainer_state.json`` does not belong to checkpoint ``step``: the Trainer would resume a state without
    ``global_step`` at step 0, with the optimizer of a later step."""
    state = json.loads(path.read_text(encoding="utf-8"))
    found = state.get("global_step", "none") if isinstance(state, dict) else f"a {type(state).__name__}, not an object"
    return None if found == step else f"global_step {found}, expected {step}"


def usable_checkpoint(ckpt_dir: Path, log: list[str], layout: WeightsLayout | None = None) -> Path | None:
    """The newest checkpoint that loads (its weights fitting ``layout`` where given); unusable ones are renamed
    ``*.corrupt`` and reported."""
    ckpts = sorted(
        (p for p in ckpt_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()),
        key=step_of,
        reverse=True,
    )
    for ckpt in ckpts:
        problem = checkpoint_problem(ckpt, layout)
        if problem is None:
            return ckpt
        log.append(f"{ckpt.name} is unusable ({problem}); falling back to the previous checkpoint")
        ckpt.rename(ckpt.with_name(ckpt.name + ".corrupt"))
    return None


def prepare_checkpoints(
    ckpt_dir: Path,
    fingerprint: str,
    log: list[str],
    settings: dict[str, str] | None = None,
    layout: WeightsLayout | None = None,
) -> Path | None:
    """Resume point for this configuration; checkpoints of another one are moved aside.

    ``settings`` are resolved values that are part of the fingerprint but not of params.yaml
    (``precision: auto`` resolves per machine): when one of them changed, the log names it.
    ``layout``: the model's (:func:`weights_layout`); a checkpoint whose weights do not fit it is set aside.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    marker = ckpt_dir / "run.json"
    settings = settings or {}
    before = read_run_marker(marker) if marker.exists() else {"fingerprint": fingerprint}
    if before.get("fingerprint") != fingerprint:
        aside = ckpt_dir.parent / f"{ckpt_dir.name}.previous"
        shutil.rmtree(aside, ignore_errors=True)
        ckpt_dir.rename(aside)
        ckpt_dir.mkdir()
        old: dict[str, Any] = before.get("settings", {})
        changed = [f"{k} {old[k]} -> {v}" for k, v in settings.items() if k in old and old[k] != v]
        if "problem" in before:  # which run wrote them is unknown: never resume them
            what = f"{marker} is unreadable ({before['problem']}), so the run that wrote the checkpoints is unknown"
        elif changed:
            what = f"{', '.join(changed)} since the checkpoints were written (checkpoints of one precision are not resumed in another)"
        else:
            what = "params, training code, data or tokenizer changed since the checkpoints were written"
        log.append(f"{what}: moved them to {aside}, starting fresh")
    write_json(marker, {"fingerprint": fingerprint, "settings": settings})
    return usable_checkpoint(ckpt_dir, log, layout)


def read_run_marker(marker: Path) -> dict[str, Any]:
    """``run.json`` (the fingerprint and settings of the run that wrote the checkpoints), or ``{"problem": ...}``
    when it is truncated or garbled (a kill or a full disk while it was written by hand or by an older version)."""
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return {"problem": f"{type(err).__name__}: {str(err)[:120]}"}
    if not isinstance(data, dict) or not isinstance(data.get("fingerprint"), str):
        return {"problem": "no fingerprint in it"}
    return data


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
