"""The models fine-tuning trains (the adapted encoder, the un-adapted baseline) and how one is trained.

What the finetune stage and the search stage's trials share: a :class:`Contender` names an encoder,
its tokenizer and its tokenized tasks; :func:`train_contender` builds the multi-task model (seeded
heads) and trains it with :func:`pipeline.training.trainer.train` under a fingerprint that a
checkpoint must share to be resumed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.paths import Paths
from pipeline.modelling.precision import Precision
from pipeline.training.checkpoints import fingerprint


@dataclass
class Contender:
    """One model to fine-tune: where its encoder, tokenizer and tokenized tasks come from."""

    name: str  # adapted | baseline | single-<task>
    encoder: Any
    tokenizer: Any
    tokenized: Path
    source: str  # for reports: the encoder's origin


def adapted_contender(paths: Paths) -> Contender:
    from transformers import AutoTokenizer

    from pipeline.training.multitask import load_encoder

    return Contender(
        "adapted",
        load_encoder(paths.dapt, "the adapted model"),
        AutoTokenizer.from_pretrained(paths.dapt),
        paths.task_features,
        str(paths.dapt),
    )


def baseline_contender(cfg: Config, paths: Paths) -> Contender:
    """The un-adapted base model with the vocabulary it was trained with (no domain tokens)."""
    import torch
    from transformers import AutoTokenizer, BertModel

    from pipeline.modelling.models import resolve_base, scratch_bert_config
    from pipeline.training.multitask import load_encoder

    own_vocab = paths.tokenized / "baseline"  # written by tokenize when it extended the vocab
    tok_dir, tasks_dir = (
        (own_vocab / "tokenizer", own_vocab / "tasks") if own_vocab.exists() else (paths.tokenizer, paths.task_features)
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    pc = cfg.pretrain
    if pc.base_model == "scratch":  # un-adapted = randomly initialised, the same architecture pretrain started from
        torch.manual_seed(cfg.seed)
        s = pc.scratch
        encoder = BertModel(scratch_bert_config(s, len(tok), tok.pad_token_id), add_pooling_layer=False)
        return Contender("baseline", encoder, tok, tasks_dir, "scratch (random init)")
    source = resolve_base(pc.base_model, "pretrain.base_model")
    encoder = load_encoder(source, "pretrain.base_model")
    if encoder.config.vocab_size < len(tok):
        raise DataError(
            tok_dir,
            None,
            "vocab-mismatch",
            f"the baseline tokenizer has {len(tok)} tokens but '{pc.base_model}' has "
            f"vocab_size={encoder.config.vocab_size}",
        )
    return Contender("baseline", encoder, tok, tasks_dir, pc.base_model)


# ----------------------------------------------------------------------------- training


def run_fingerprint(
    cfg: Config,
    contender: Contender,
    tasks: dict[str, Any],
    weights: Path | None,
    precision: Precision,
    extra_steps: int = 0,
) -> str:
    """What a checkpoint must share with this run to be resumed: params, seed, precision, code, encoder and task data."""
    # which other models the stage trains (baseline, single_task), and whether beside them (side_by_side), does not
    # change this one's recipe: a run killed side by side resumes one after the other, and the other way round
    recipe = cfg.finetune.model_dump(mode="json", exclude={"baseline", "single_task", "side_by_side"})
    payload = {
        "finetune": recipe,
        "seed": cfg.seed,
        "model": contender.name,
        "tasks": sorted(tasks),
        "precision": precision.name,
        **({"extra_steps": extra_steps} if extra_steps else {}),  # same_compute: a resumed run keeps its step count
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    code = Path(__file__).parent.parent
    data = [contender.tokenized / t / "train.arrow" for t in sorted(tasks)] + ([weights] if weights else [])
    types = sorted({inspect.getfile(type(t.spec.kind)) for t in tasks.values()})  # heads, losses, collators
    modules = [
        "training/contenders.py",
        "training/trainer.py",
        "training/arguments.py",
        "training/adversarial.py",
        "training/multitask.py",
        "modelling/heads.py",
        "tasks/base.py",
    ]
    return fingerprint(digest, [code / m for m in modules] + [Path(t) for t in types], data)


def build_model(cfg: Config, contender: Contender, tasks: dict[str, Any]) -> Any:
    """The encoder plus one fresh head per task; heads are seeded, so both contenders start alike."""
    from transformers import set_seed

    from pipeline.training.multitask import MultiTaskModel

    set_seed(cfg.seed)
    weights = {}
    for name, data in tasks.items():
        spec = data.spec
        if spec.settings.class_weights == "balanced":
            weight = spec.kind.balanced_weights(data.splits["train"]["labels"], spec)
            if weight is not None:
                weights[name] = weight
    return MultiTaskModel(contender.encoder, [d.spec for d in tasks.values()], cfg.finetune.dropout, weights)


@dataclass(frozen=True)
class TrainPlace:
    """Where a training run keeps its checkpoints and curves, the MLflow run it logs into, what else watches it."""

    checkpoints: Path
    curves: Path
    run_name: str
    stage: str = "finetune"  # the console prefix
    callbacks: tuple[Any, ...] = ()  # more TrainerCallbacks (the search's pruning)
    run_params: tuple[tuple[str, str], ...] = ()  # logged on the nested MLflow run (a trial's values)


def finetune_place(paths: Paths, contender: Contender) -> TrainPlace:
    """The finetune stage's: ``checkpoints/finetune/<name>`` (its curves in ``curves/`` there while it trains), run
    ``finetune-<name>``."""
    return TrainPlace(
        paths.finetune_checkpoints / contender.name,
        paths.finetune_checkpoints / contender.name / "curves",  # the stage's commit copies them to reports/finetune
        f"finetune-{contender.name}",
    )


def train_contender(
    cfg: Config,
    paths: Paths,
    contender: Contender,
    tasks: dict[str, Any],
    precision: Precision,
    extra_steps: int = 0,
    place: TrainPlace | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Fine-tune one contender (or resume it) in ``precision`` for ``finetune.max_steps`` or the steps of its
    ``finetune.epochs`` (+ ``extra_steps``),
    where ``place`` says (the finetune stage's by default); return the best model and its training summary."""
    from pipeline.training.adversarial import Adversarial
    from pipeline.training.trainer import TrainJob, step_plan, train

    place = place or finetune_place(paths, contender)
    plan = step_plan(cfg.finetune, tasks, cfg.finetune.max_steps)  # finetune.epochs: at most max_steps
    if plan.capped():
        print(f"{place.stage} ({contender.name}): {plan.capped()}", file=sys.stderr)
    model = build_model(cfg, contender, tasks)
    weights = Path(contender.source) / "model.safetensors" if Path(contender.source).is_dir() else None
    job = TrainJob(
        name=contender.name,
        run_name=place.run_name,
        model=model,
        tokenizer=contender.tokenizer,
        tasks=tasks,
        checkpoints=place.checkpoints,
        curves=place.curves,
        max_steps=plan.max_steps + extra_steps,
        learning_rate=cfg.finetune.learning_rate,
        adversarial=Adversarial.from_config(cfg.finetune),
        stage=place.stage,
        callbacks=place.callbacks,
        run_params=dict(place.run_params),
    )
    fp = run_fingerprint(cfg, contender, tasks, weights, precision, extra_steps)
    model, summary = train(cfg.finetune, cfg.seed, job, precision, fp, place.stage)
    return model, {"encoder": contender.source, "vocab_size": len(contender.tokenizer), **summary}
