"""The compressed variants, one entry each: how it is built, whether it is quantised, what it starts
from and what its model card says.

- ``int8``: dynamic INT8 quantisation of every linear layer (:mod:`pipeline.compression.quantize`);
- ``distilled``: a student with every other layer, trained on the teacher's soft targets plus the
  gold labels (:mod:`pipeline.compression.distill`), finetune's sampler and early stopping;
- ``pruned``: the least important attention heads (gradient importance on the dev sets) sliced
  out of the projections, then a short recovery fine-tune (:mod:`pipeline.compression.prune`);
- ``distilled_int8``: the student, quantised.

Adding a variant = one function that builds it and its entry in :data:`VARIANTS` (plus its name in the
values ``compress.variants`` accepts, ``pipeline/core/sections/compress.py``, where params are checked).
The compress stage, the measurements and the model cards read the entry; nothing else knows the name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.config import Config
from pipeline.core.paths import Paths
from pipeline.modelling.precision import Precision

Built = tuple[Any, dict[str, Any]]  # (model, build summary: teacher_layers, heads, training facts)


@dataclass(frozen=True)
class BuildJob:
    """What building any variant reads: the config, where its curves go, the teacher with its data and tokenizer."""

    cfg: Config
    paths: Paths
    curves: Path  # learning curves of trained variants: <curves>/<variant>/
    teacher: Any  # the full multi-task model (models/finetuned), never modified
    tok: Any
    tasks: dict[str, Any]  # name -> TaskData
    precision: Precision
    backend: Any  # the INT8 engine (pipeline.compression.quantize.Backend); None when no variant is quantised


@dataclass(frozen=True)
class Variant:
    """A compressed variant: its builder, whether it is quantised (served with fp32 activations), the variant it
    starts from (built first, once) and the model card's sentence from its build summary."""

    name: str
    build: Callable[[BuildJob, Built | None], Built]  # (job, the starting variant's build or None) -> its build
    quantised: bool
    card: Callable[[dict[str, Any]], str]
    starts_from: str | None = None


def train_variant(job: BuildJob, name: str, model: Any, **train: Any) -> Built:
    """Train ``model`` with finetune's recipe (resumable under ``checkpoints/compress/<name>``); curves to ``curves/``."""
    import hashlib
    import json

    from pipeline.training.checkpoints import fingerprint
    from pipeline.training.trainer import TrainJob
    from pipeline.training.trainer import train as train_model

    cfg = job.cfg
    payload = {"compress": cfg.compress.model_dump(mode="json"), "finetune": cfg.finetune.model_dump(mode="json")}
    payload |= {"seed": cfg.seed, "variant": name, "precision": job.precision.name}
    code = Path(__file__).parent.parent
    modules = [
        "compression/recipes.py",
        "training/trainer.py",
        "training/arguments.py",
        "compression/distill.py",
        "compression/prune.py",
    ]
    fp = fingerprint(
        hashlib.sha256(json.dumps(payload, sort_keys=True).encode()),
        [code / m for m in modules],
        [job.paths.finetuned / "heads.safetensors"],
    )
    train_job = TrainJob(
        name=name,
        run_name=f"compress-{name}",
        model=model,
        tokenizer=job.tok,
        tasks=job.tasks,
        checkpoints=job.paths.compress_checkpoints / name,
        curves=job.curves / name,
        stage="compress",
        **train,
    )
    return train_model(cfg.finetune, cfg.seed, train_job, job.precision, fp, "compress")


def build_int8(job: BuildJob, _: Built | None) -> Built:
    from pipeline.compression.quantize import quantize

    return quantize(job.teacher, job.backend, job.cfg.compress.int8.per_channel), {
        "teacher_layers": None,
        "heads": None,
    }


def build_distilled(job: BuildJob, _: Built | None) -> Built:
    from pipeline.compression.distill import distillation_loss, student_from_teacher, student_layers

    dc = job.cfg.compress.distill
    layers = student_layers(int(job.teacher.encoder.config.num_hidden_layers), dc.student_layers)
    student = student_from_teacher(job.teacher, layers)
    model, summary = train_variant(
        job,
        "distilled",
        student,
        max_steps=dc.max_steps,
        learning_rate=dc.learning_rate,
        compute_loss=distillation_loss(job.teacher, dc.alpha, dc.temperature),
    )
    return model, {"teacher_layers": layers, "heads": None, **summary}


def build_pruned(job: BuildJob, _: Built | None) -> Built:
    import copy

    from pipeline.compression.prune import head_importance, heads_to_keep, slice_heads

    pc, cfg = job.cfg.compress.prune, job.cfg
    model = copy.deepcopy(job.teacher).requires_grad_(True)  # every weight recovers, not only the sliced projections
    importance = head_importance(model, job.tasks, job.tok.pad_token_id, cfg.finetune.batch_size, pc.importance_batches)
    keep = heads_to_keep(importance, pc.fraction)
    slice_heads(model.encoder, keep)
    summary: dict[str, Any] = {"teacher_layers": None, "heads": keep, "importance": np.round(importance, 4).tolist()}
    if pc.recovery_steps:
        model, trained = train_variant(
            job, "pruned", model.train(), max_steps=pc.recovery_steps, learning_rate=pc.learning_rate
        )
        summary |= trained
    return model.eval(), summary


def build_quantised_student(job: BuildJob, student: Built | None) -> Built:
    from pipeline.compression.quantize import quantize

    assert student is not None  # VARIANTS builds its starting variant first
    return quantize(student[0], job.backend, job.cfg.compress.int8.per_channel), dict(student[1])


def _kept_heads(summary: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {len(v)}" for k, v in (summary.get("heads") or {}).items())


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "int8", build_int8, True, lambda s: "every linear layer (encoder and heads) dynamically quantised to INT8"
        ),
        Variant(
            "distilled", build_distilled, False, lambda s: f"distilled into the teacher's layers {s['teacher_layers']}"
        ),
        Variant(
            "pruned",
            build_pruned,
            False,
            lambda s: f"attention heads pruned (kept per layer: {_kept_heads(s)}), then recovered",
        ),
        Variant(
            "distilled_int8",
            build_quantised_student,
            True,
            lambda s: "the distilled student, quantised to INT8",
            starts_from="distilled",
        ),
    )
}


def is_quantised(name: str) -> bool:
    """Whether model ``name`` (a variant, or ``full``) runs int8 weights (then fp32 activations)."""
    return name in VARIANTS and VARIANTS[name].quantised


def build_variants(job: BuildJob, names: Sequence[str]) -> dict[str, tuple[Any, dict[str, Any], dict[str, Any]]]:
    """name -> (model, compression.json meta, build summary), in ``names`` order; a starting variant is built
    once, also when only the variants made from it were asked for."""
    from pipeline.compression.variants import variant_meta

    made: dict[str, Built] = {}

    def make(name: str) -> Built:
        if name not in made:
            variant = VARIANTS[name]
            made[name] = variant.build(job, make(variant.starts_from) if variant.starts_from else None)
        return made[name]

    int8 = job.cfg.compress.int8
    built: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
    for name in names:
        start = time.perf_counter()
        model, summary = make(name)
        summary = {**summary, "build_seconds": round(time.perf_counter() - start, 1)}
        backend = job.backend if VARIANTS[name].quantised else None
        meta = variant_meta(name, summary["teacher_layers"], summary["heads"], backend, int8.backend, int8.per_channel)
        built[name] = (model, meta, summary)
    return built
