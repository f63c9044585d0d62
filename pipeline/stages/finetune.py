"""finetune stage: multi-task fine-tuning of the adapted encoder, and of the un-adapted baseline.

One shared encoder (``models/dapt/``) with one head per declared task, trained by
:func:`pipeline.modelling.training.train` (the HF Trainer on single-task batches: task sampling,
per-task loss weights, layer-wise LR decay, warmup then decay, gradient clipping, dev evaluation
every ``eval_steps`` with early stopping on the mean of the tasks' primary dev metrics, and the
best checkpoint restored at the end). With ``finetune.baseline`` the un-adapted base model (its own
vocabulary, same recipe, seed and step budget) is trained the same way: evaluate compares the
two. Outputs replace ``models/finetuned/`` and ``models/baseline/`` only when every run succeeded.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.io import read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.modelling.checkpoints import fingerprint
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.tasks.data import load_tasks
from pipeline.tasks.registry import kind_of

# ----------------------------------------------------------------------------- inputs


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

    from pipeline.modelling.multitask import load_encoder

    return Contender(
        "adapted",
        load_encoder(paths.dapt),
        AutoTokenizer.from_pretrained(paths.dapt),
        paths.tokenized / "tasks",
        str(paths.dapt),
    )


def baseline_contender(cfg: Config, paths: Paths) -> Contender:
    """The un-adapted base model with the vocabulary it was trained with (no domain tokens)."""
    import torch
    from transformers import AutoTokenizer, BertModel

    from pipeline.modelling.models import resolve_base, scratch_bert_config
    from pipeline.modelling.multitask import load_encoder

    own_vocab = paths.tokenized / "baseline"  # written by tokenize when it extended the vocab
    tok_dir, tasks_dir = (
        (own_vocab / "tokenizer", own_vocab / "tasks")
        if own_vocab.exists()
        else (paths.tokenizer, paths.tokenized / "tasks")
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    pc = cfg.pretrain
    if pc.base_model == "scratch":  # un-adapted = randomly initialised, the same architecture pretrain started from
        torch.manual_seed(cfg.seed)
        s = pc.scratch
        encoder = BertModel(scratch_bert_config(s, len(tok), tok.pad_token_id), add_pooling_layer=False)
        return Contender("baseline", encoder, tok, tasks_dir, "scratch (random init)")
    source = resolve_base(pc.base_model, "pretrain.base_model")
    encoder = load_encoder(source)
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
    # which other models the stage trains (baseline, single_task) does not change this one's training
    recipe = cfg.finetune.model_dump(mode="json", exclude={"baseline", "single_task"})
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
    types = sorted({inspect.getfile(type(kind_of(t.spec.type))) for t in tasks.values()})  # heads, losses, collators
    modules = [
        "stages/finetune.py",
        "modelling/training.py",
        "modelling/adversarial.py",
        "modelling/multitask.py",
        "modelling/heads.py",
        "tasks/base.py",
    ]
    return fingerprint(digest, [code / m for m in modules] + [Path(t) for t in types], data)


def build_model(cfg: Config, contender: Contender, tasks: dict[str, Any]) -> Any:
    """The encoder plus one fresh head per task; heads are seeded, so both contenders start alike."""
    from transformers import set_seed

    from pipeline.modelling.multitask import MultiTaskModel

    set_seed(cfg.seed)
    weights = {}
    for name, data in tasks.items():
        spec = data.spec
        if spec.settings.class_weights == "balanced":
            weight = kind_of(spec.type).balanced_weights(data.splits["train"]["labels"], spec)
            if weight is not None:
                weights[name] = weight
    return MultiTaskModel(contender.encoder, [d.spec for d in tasks.values()], cfg.finetune.dropout, weights)


def train_contender(
    cfg: Config,
    paths: Paths,
    contender: Contender,
    tasks: dict[str, Any],
    precision: Precision,
    extra_steps: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """Fine-tune one contender (or resume it) in ``precision`` for ``finetune.max_steps`` (+ ``extra_steps``);
    return the best model and its training summary."""
    from pipeline.modelling.adversarial import Adversarial
    from pipeline.modelling.training import TrainJob, train

    model = build_model(cfg, contender, tasks)
    weights = Path(contender.source) / "model.safetensors" if Path(contender.source).is_dir() else None
    job = TrainJob(
        name=contender.name,
        run_name=f"finetune-{contender.name}",
        model=model,
        tokenizer=contender.tokenizer,
        tasks=tasks,
        checkpoints=paths.finetune_checkpoints / contender.name,
        curves=paths.finetune_curves / contender.name,
        max_steps=cfg.finetune.max_steps + extra_steps,
        learning_rate=cfg.finetune.learning_rate,
        adversarial=Adversarial.from_config(cfg.finetune),
    )
    fp = run_fingerprint(cfg, contender, tasks, weights, precision, extra_steps)
    model, summary = train(cfg.finetune, cfg.seed, job, precision, fp, "finetune")
    return model, {"encoder": contender.source, "vocab_size": len(contender.tokenizer), **summary}


def model_card(cfg: Config, contender: Contender, summary: dict[str, Any], tasks: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {n} | {d.spec.type} | {len(d.spec.labels) or '-'} | {d.spec.primary} |" for n, d in tasks.items()
    )
    return f"""# adaptbert multi-task model: {contender.name}

Encoder from `{contender.source}`, fine-tuned on {len(tasks)} task(s) with one head each
(best dev mean primary metric {summary["best_dev_mean_primary"]} at step {summary["best_step"]} of {summary["steps"]}).

| task | type | labels | primary metric |
|---|---|---|---|
{rows}

Files: `encoder/` (a `BertModel`, `AutoModel.from_pretrained`), `heads.safetensors`, the tokenizer,
`tasks.json` (task types, label maps, head settings). Load both with
`pipeline.modelling.multitask.load_multitask(this_dir)`.
"""


def single_task_scores(cfg: Config, paths: Paths, tasks: dict[str, Any], precision: Precision) -> dict[str, Any]:
    """One model per task (adapted encoder, same recipe and budget): its test metrics, for comparison."""
    from pipeline.modelling.multitask import score_task

    out = {}
    for name, data in tasks.items():
        contender = adapted_contender(paths)
        contender.name = f"single-{name}"
        model, summary = train_contender(cfg, paths, contender, {name: data}, precision)
        scored = score_task(
            model, data, "test", contender.tokenizer.pad_token_id, cfg.finetune.eval_batch_size, precision
        )
        out[name] = {"test": scored.metrics, "primary": data.spec.primary, **summary}
    return out


def same_compute_steps(paths: Paths, adapted: dict[str, Any]) -> dict[str, Any]:
    """The baseline's extra fine-tuning steps under ``baseline_budget: same_compute``: the pretraining's training
    seconds (reports/pretrain.json, with its measured half) x the adapted run's steps per second."""
    pre = read_report(paths.pretrain_report, "pretrain")
    seconds, steps_per_s = pre.get("train_seconds"), None
    if adapted.get("train_seconds") and adapted.get("steps"):
        steps_per_s = adapted["steps"] / adapted["train_seconds"]
    if not seconds or not steps_per_s:
        raise DataError(
            paths.pretrain_report,
            None,
            "missing-input",
            "finetune.baseline_budget: same_compute needs the pretraining time (train_seconds in reports/measured/"
            "pretrain.json) and the adapted run's speed; run dvc repro pretrain again, or use same_steps",
        )
    return {
        "pretrain_seconds": seconds,
        "adapted_steps_per_s": round(steps_per_s, 3),
        "extra_steps": round(seconds * steps_per_s),
    }


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Fine-tune the adapted model (and the baseline); write the models and ``reports/finetune.json``."""
    from pipeline.modelling.multitask import save_multitask

    fc = cfg.finetune
    precision = resolve_precision(cfg.precision)  # before any work: bf16 asked on hardware without it stops here
    require_inputs({paths.dapt: "pretrain", paths.tokenized / "tasks": "tokenize", paths.tasks: "ingest"})
    contenders = [adapted_contender(paths)] + ([baseline_contender(cfg, paths)] if fc.baseline else [])
    trained = []
    budget: dict[str, Any] = {"mode": fc.baseline_budget}
    for contender in contenders:
        tasks = load_tasks(cfg, paths, contender.tokenized)
        extra = 0
        if contender.name == "baseline" and fc.baseline_budget == "same_compute":
            budget.update(same_compute_steps(paths, trained[0][3]))
            extra = budget["extra_steps"]
        model, summary = train_contender(cfg, paths, contender, tasks, precision, extra)
        trained.append((contender, tasks, model, summary))
    report: dict[str, Any] = {name: summary for (c, _, _, summary) in trained for name in [c.name]}
    if fc.baseline and fc.baseline_budget == "same_compute":  # (absent by default: the report stays as it was)
        report["baseline_budget"] = budget
    report.update(precision.as_report())
    report["tasks"] = {
        n: {
            "type": d.spec.type,
            "primary": d.spec.primary,
            "labels": d.spec.labels,
            "train_features": len(d.splits["train"]),
        }
        for n, d in trained[0][1].items()
    }
    if fc.single_task:
        report["single_task"] = single_task_scores(cfg, paths, trained[0][1], precision)
    with transaction(paths.root, "finetune") as txn:
        out_adapted, out_baseline = txn.dir(paths.finetuned), txn.dir(paths.baseline)
        for (contender, tasks, model, summary), out in zip(trained, (out_adapted, out_baseline), strict=False):
            save_multitask(model, contender.tokenizer, out, model_card(cfg, contender, summary, tasks))
        if not fc.baseline:
            (out_baseline / "README.md").write_text(
                "finetune.baseline is false: no baseline model was trained.\n", encoding="utf-8"
            )
        txn.write_report(paths.finetune_report, report)
    return report


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline finetune`` (what ``run`` returned, read for a person)."""
    lines = []
    for name in ("adapted", "baseline"):
        if name in r:
            m = r[name]
            stop = "stopped early" if m["stopped_early"] else "ran to max_steps"
            speed = (
                f"{m['train_examples_per_s']} examples/s"
                if m["train_examples_per_s"]
                else f"resumed finished run {m['resumed_from']}"
            )
            lines.append(
                f"{name}: {m['steps']} steps ({stop}), best dev mean primary {m['best_dev_mean_primary']} at step {m['best_step']}, "
                f"{speed}"
            )
    return (
        "\n".join(lines)
        + f"\n{r['precision_reason']}\nmodels: {paths.finetuned}, {paths.baseline}; report: {paths.finetune_report}"
    )
