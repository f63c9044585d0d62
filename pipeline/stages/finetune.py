"""finetune stage: multi-task fine-tuning of the adapted encoder, and of the un-adapted baseline.

One shared encoder (``models/dapt/``) with one head per declared task, trained with the HF
Trainer on single-task batches (:mod:`pipeline.modelling.multitask`): task sampling, per-task loss
weights, layer-wise LR decay, warmup then decay, gradient clipping, dev evaluation every
``eval_steps`` with early stopping on the mean of the tasks' primary dev metrics, and the best
checkpoint restored at the end. With ``finetune.baseline`` the un-adapted base model (its own
vocabulary, same recipe, seed and step budget) is trained the same way: evaluate compares the
two. Outputs replace ``models/finetuned/`` and ``models/baseline/`` only when every run succeeded.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.io import require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.modelling.callbacks import CurveLogger
from pipeline.modelling.checkpoints import fingerprint, keep_curves_until, prepare_checkpoints, step_of
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.tasks.data import load_tasks
from pipeline.tasks.registry import kind_of
from pipeline.tracking.runs import nested_run, trainer_report_to

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
    cfg: Config, contender: Contender, tasks: dict[str, Any], weights: Path | None, precision: Precision
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
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    code = Path(__file__).parent.parent
    data = [contender.tokenized / t / "train.arrow" for t in sorted(tasks)] + ([weights] if weights else [])
    types = sorted({inspect.getfile(type(kind_of(t.spec.type))) for t in tasks.values()})  # heads, losses, collators
    modules = ["stages/finetune.py", "modelling/multitask.py", "modelling/heads.py", "tasks/base.py"]
    return fingerprint(digest, [code / m for m in modules] + [Path(t) for t in types], data)


def check_resume_heads(ckpt: Path, specs: list[Any]) -> None:
    """A checkpoint whose heads do not fit the current label maps cannot be resumed: say so."""
    from safetensors import safe_open

    from pipeline.modelling.multitask import head_shapes_problem

    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith("heads.")}  # noqa: SIM118 (safe_open is not iterable)
    problem = head_shapes_problem(shapes, specs)
    if problem:
        raise DataError(
            ckpt / "model.safetensors",
            None,
            "head-mismatch",
            f"cannot resume from {ckpt.name}: {problem}. Delete {ckpt.parent} to start fresh, or restore the labels",
        )


def dev_scores(
    model: Any, tasks: dict[str, Any], pad_id: int, batch_size: int, precision: Precision
) -> dict[str, float]:
    """``mean_primary`` and ``<task>_<metric>`` on the validation splits (what early stopping watches)."""
    from pipeline.modelling.multitask import mean_primary, score_task

    out: dict[str, float] = {}
    primaries = {}
    for name, data in tasks.items():
        scored = score_task(model, data, "validation", pad_id, batch_size, precision)
        primaries[name] = scored.primary(data.spec)
        out[f"{name}_{data.spec.primary}"] = round(primaries[name], 5)
    out["mean_primary"] = round(mean_primary(primaries), 5)
    return out


def curve_columns(tasks: dict[str, Any]) -> list[str]:
    return ["step", "loss", "learning_rate", "grad_norm", "eval_mean_primary"] + [
        f"eval_{n}_{d.spec.primary}" for n, d in tasks.items()
    ]


def make_trainer(
    cfg: Config,
    paths: Paths,
    contender: Contender,
    model: Any,
    tasks: dict[str, Any],
    curves: Path,
    precision: Precision,
) -> Any:
    """An HF Trainer over single-task batches, with the LLRD optimiser, dev metrics and early stopping;
    ``precision`` bf16 is the Trainer's autocast (fp32 weights, optimiser state and losses)."""
    import torch
    from transformers import EarlyStoppingCallback, Trainer, TrainingArguments

    from pipeline.modelling.multitask import (
        MultiTaskBatchSampler,
        MultiTaskDataset,
        llrd_param_groups,
        make_collate,
        task_probabilities,
    )

    fc = cfg.finetune
    cuda = precision.device == "cuda"
    pad_id = contender.tokenizer.pad_token_id
    args = TrainingArguments(
        output_dir=str(paths.finetune_checkpoints / contender.name),
        run_name=f"finetune-{contender.name}",
        max_steps=fc.max_steps,
        per_device_train_batch_size=fc.batch_size,
        learning_rate=fc.learning_rate,
        weight_decay=fc.weight_decay,
        warmup_steps=fc.warmup_ratio,
        lr_scheduler_type=fc.lr_schedule,
        max_grad_norm=fc.max_grad_norm,
        logging_steps=fc.logging_steps,
        logging_nan_inf_filter=False,
        eval_strategy="steps",
        eval_steps=fc.eval_steps,
        save_strategy="steps",
        save_steps=fc.eval_steps,
        save_total_limit=fc.save_total_limit,
        load_best_model_at_end=True,
        metric_for_best_model="mean_primary",
        greater_is_better=True,
        bf16=precision.bf16,
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        report_to=trainer_report_to(),
        use_cpu=not cuda,
        disable_tqdm=True,
    )
    sizes = {n: len(d.splits["train"]) for n, d in tasks.items()}
    probs = task_probabilities(
        sizes, fc.sampling, fc.temperature, {n: d.spec.settings.sampling_weight for n, d in tasks.items()}
    )
    steps_per_epoch = max(1, math.ceil(sum(sizes.values()) / fc.batch_size))
    sampler = MultiTaskBatchSampler(
        {n: d.lengths("train") for n, d in tasks.items()},
        probs,
        fc.batch_size,
        fc.bucket_batches,
        steps_per_epoch,
        cfg.seed,
    )
    collate = make_collate({n: d.spec for n, d in tasks.items()}, pad_id)
    optimizer = torch.optim.AdamW(
        llrd_param_groups(model, fc.learning_rate, fc.layer_lr_decay, fc.weight_decay), lr=fc.learning_rate, fused=True
    )  # CPU too: faster than the for-loop default (docs/speed.md)
    columns = curve_columns(tasks)

    curve_logger = CurveLogger(curves, columns, triggers=("loss", "eval_mean_primary"), who=contender.name)

    class MultiTaskTrainer(Trainer):
        def get_train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(
                MultiTaskDataset(tasks), batch_sampler=sampler, collate_fn=collate, num_workers=0
            )

        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            out = model(**inputs)
            return (out["loss"], out) if return_outputs else out["loss"]

        def evaluate(
            self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
        ) -> dict[str, float]:
            metrics = {
                f"{metric_key_prefix}_{k}": v
                for k, v in dev_scores(self.model, tasks, pad_id, fc.eval_batch_size, precision).items()
            }
            self.model.train()
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    return MultiTaskTrainer(
        model=model,
        args=args,
        train_dataset=MultiTaskDataset(tasks),
        eval_dataset={n: d.splits["validation"] for n, d in tasks.items()},
        data_collator=collate,
        processing_class=contender.tokenizer,
        optimizers=(optimizer, None),
        callbacks=[curve_logger, EarlyStoppingCallback(fc.early_stopping_patience, fc.early_stopping_threshold)],
    )


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
    cfg: Config, paths: Paths, contender: Contender, tasks: dict[str, Any], precision: Precision
) -> tuple[Any, dict[str, Any]]:
    """Fine-tune one contender (or resume it) in ``precision``; return the best model and its training summary."""
    model = build_model(cfg, contender, tasks)
    curves = paths.finetune_curves / f"{contender.name}.csv"
    weights = Path(contender.source) / "model.safetensors" if Path(contender.source).is_dir() else None
    log: list[str] = []
    ckpt_dir = paths.finetune_checkpoints / contender.name
    resume = prepare_checkpoints(
        ckpt_dir, run_fingerprint(cfg, contender, tasks, weights, precision), log, {"precision": precision.name}
    )
    if resume:
        check_resume_heads(resume, [d.spec for d in tasks.values()])
    for line in log:
        print(f"finetune ({contender.name}): {line}", file=sys.stderr)
    keep_curves_until(curves, step_of(resume) if resume else 0)
    state = json.loads((resume / "trainer_state.json").read_text()) if resume else {}
    with nested_run(f"finetune-{contender.name}"):  # the Trainer's MLflow callback logs into it
        trainer = make_trainer(cfg, paths, contender, model, tasks, curves, precision)
        start = time.perf_counter()
        fit(trainer, resume, state, ckpt_dir, cfg.finetune.max_steps)
        seconds = time.perf_counter() - start
    examples = (trainer.state.global_step - int(state.get("global_step", 0))) * cfg.finetune.batch_size
    best_step = (
        step_of(Path(trainer.state.best_model_checkpoint))
        if trainer.state.best_model_checkpoint
        else trainer.state.global_step
    )
    summary = {
        "encoder": contender.source,
        "vocab_size": len(contender.tokenizer),
        "resumed_from": resume.name if resume else None,
        "checkpoint_log": log,
        "steps": trainer.state.global_step,
        "best_step": best_step,
        "stopped_early": trainer.state.global_step < cfg.finetune.max_steps,
        "best_dev_mean_primary": trainer.state.best_metric,
        "train_seconds": round(seconds, 1),
        "train_examples_per_s": round(examples / max(seconds, 1e-9), 1)
        if examples
        else None,  # None: nothing left to train
    }
    return trainer.model.eval(), summary


def fit(trainer: Any, resume: Path | None, state: dict[str, Any], ckpt_dir: Path, max_steps: int) -> None:
    """Train from scratch or from ``resume``; a run that had already finished only restores its best weights."""
    from safetensors.torch import load_file

    if resume and state["global_step"] >= max_steps:
        # training had finished before the stage died: take the best weights, train no further
        best = Path(state.get("best_model_checkpoint") or resume)
        trainer.model.load_state_dict(load_file(str(ckpt_dir / best.name / "model.safetensors")), strict=False)
        trainer.state.global_step, trainer.state.best_metric = state["global_step"], state.get("best_metric")
        trainer.state.best_model_checkpoint = str(ckpt_dir / best.name)
    else:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)


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


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Fine-tune the adapted model (and the baseline); write the models and ``reports/finetune.json``."""
    from pipeline.modelling.multitask import save_multitask

    fc = cfg.finetune
    precision = resolve_precision(cfg.precision)  # before any work: bf16 asked on hardware without it stops here
    require_inputs({paths.dapt: "pretrain", paths.tokenized / "tasks": "tokenize", paths.tasks: "ingest"})
    contenders = [adapted_contender(paths)] + ([baseline_contender(cfg, paths)] if fc.baseline else [])
    trained = []
    for contender in contenders:
        tasks = load_tasks(cfg, paths, contender.tokenized)
        model, summary = train_contender(cfg, paths, contender, tasks, precision)
        trained.append((contender, tasks, model, summary))
    report: dict[str, Any] = {name: summary for (c, _, _, summary) in trained for name in [c.name]}
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
        txn.write_json(paths.finetune_report, report)
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
