"""Benchmark: multi-task fine-tuning with length-bucketed dynamic padding vs padding to max length.

    python -m benchmarks.finetune                # 60 optimiser steps per variant (~4 minutes on 2 cores)
    python -m benchmarks.finetune --steps 100

All variants train all-MiniLM-L6-v2 (offline) with the four demo tasks through the finetune
stage's own Trainer (same sampler draws, seed, batch 16, LLRD, no dev evaluation), each in a
fresh process:

1. ours: single-task batches from length buckets (``finetune.bucket_batches: 50``), padded to
   the longest example of the batch;
2. dynamic padding without buckets (``bucket_batches: 1``): what ``DataCollatorWithPadding``
   over shuffled examples gives;
3. padding to max length (128): ``run_glue.py --pad_to_max_length``, the obvious alternative.

Then scoring speed: every test split scored by ``score_task`` (length-sorted batches of 64,
dynamic padding) against the same batches padded to 128. Results: ``benchmarks/results/finetune.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT, measure, measured_row, save_results

PREPARE = """
import sys
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.text import demo_domain as demo
from pipeline.stages import ingest, validate, tokenize
cfg = load_config("params.yaml", {"tokenize.extend_vocab.enabled": False})
paths = Paths(Path(sys.argv[1]))
demo.run(cfg.demo, paths.demo); ingest.run(cfg, paths); validate.run(cfg, paths); tokenize.run(cfg, paths)
"""

# Shared by both child scripts: the model and tasks; for variant max_length every batch is padded
# to 128 tokens, as run_glue --pad_to_max_length (a collator swapped into the task registry).
SETUP = """
import sys, json, time, dataclasses
from pathlib import Path
import torch
from transformers import AutoTokenizer
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.training.contenders import Contender, build_model
from pipeline.tasks import base, registry
from pipeline.training.data import load_tasks
from pipeline.modelling.models import resolve_base
from pipeline.training.multitask import load_encoder, score_task
from pipeline.modelling.precision import resolve_precision
from pipeline.training.trainer import TrainJob, make_trainer
root, variant, precision = Path(sys.argv[1]), sys.argv[2], resolve_precision(sys.argv[3])

def pad_to_max(features, pad_id):
    batch = base.pad_features(features, pad_id)
    extra = 128 - batch["input_ids"].shape[1]
    fill = {"input_ids": pad_id, "labels": -100}
    return {k: torch.nn.functional.pad(v, (0, extra), value=fill.get(k, 0)) if v.ndim == 2 else v for k, v in batch.items()}

if variant == "max_length":
    for kind in registry.REGISTRY.values():
        kind.collate = pad_to_max  # an instance attribute shadows the type's method

def setup(overrides):
    cfg = load_config("params.yaml", {**overrides, "precision": precision.name})
    paths = Paths(root)
    contender = Contender("bench", load_encoder(resolve_base("minilm", "base")), AutoTokenizer.from_pretrained(paths.tokenizer),
                                   paths.task_features, "minilm")
    tasks = load_tasks(cfg, paths, contender.tokenized)
    return cfg, paths, contender, tasks, build_model(cfg, contender, tasks)
"""

TRAIN = (
    SETUP
    + """
from pipeline.training.adversarial import Adversarial
steps, extra = int(sys.argv[4]), json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # extra: benchmarks.recipes
cfg, paths, contender, tasks, model = setup({"finetune.max_steps": steps, "finetune.eval_steps": 10**6,
                                             "finetune.bucket_batches": 50 if variant == "bucketed" else 1, "finetune.logging_steps": 10,
                                             **extra})
job = TrainJob(contender.name, "bench", model, contender.tokenizer, tasks, paths.finetune_checkpoints / contender.name,
               root / f"curves_{variant}", steps, cfg.finetune.learning_rate, adversarial=Adversarial.from_config(cfg.finetune))
trainer = make_trainer(cfg.finetune, cfg.seed, job, precision)
padded, real = [0], [0]
inner = trainer.compute_loss
def counting(model, inputs, *a, **k):
    padded[0] += inputs["input_ids"].numel()
    real[0] += int(inputs["attention_mask"].sum())
    return inner(model, inputs, *a, **k)
trainer.compute_loss = counting
start = time.perf_counter()
trainer.train()
seconds = time.perf_counter() - start
print(json.dumps({"precision": precision.name, "steps": trainer.state.global_step, "examples": trainer.state.global_step * cfg.finetune.batch_size,
                  "train_seconds": round(seconds, 1), "padded_tokens": padded[0], "real_tokens": real[0]}))
"""
)

SCORE = (
    SETUP
    + """
cfg, paths, contender, tasks, model = setup({})
model.eval()
start = time.perf_counter()
examples = 0
for name, data in tasks.items():
    score_task(model, data, "test", contender.tokenizer.pad_token_id, 64, precision)
    examples += len(data.rows["test"])
print(json.dumps({"precision": precision.name, "examples": examples, "seconds": round(time.perf_counter() - start, 2)}))
"""
)


def bench(steps: int, workdir: Path) -> tuple[list[dict], list[dict]]:
    project = workdir / "project"
    measure(PREPARE, str(project))
    train_rows = [
        measured_row(
            name,
            TRAIN,
            str(project),
            variant,
            precision,
            str(steps),
            rates=lambda i: {
                "examples_per_s": round(i["examples"] / i["train_seconds"], 1),
                "padding_share": round(1 - i["real_tokens"] / i["padded_tokens"], 3),
            },
        )
        for name, variant, precision in (
            ("ours: length buckets + dynamic padding, precision auto", "bucketed", "auto"),
            ("ours in fp32", "bucketed", "fp32"),
            ("dynamic padding, no buckets, fp32", "dynamic", "fp32"),
            ("padding to max length 128, fp32", "max_length", "fp32"),
        )
    ]
    score_rows = [
        measured_row(
            name,
            SCORE,
            str(project),
            variant,
            precision,
            rates=lambda i: {"examples_per_s": round(i["examples"] / i["seconds"], 1)},
        )
        for name, variant, precision in (
            ("ours: length-sorted batches, dynamic padding, precision auto", "dynamic", "auto"),
            ("ours in fp32", "dynamic", "fp32"),
            ("padding to max length 128, fp32", "max_length", "fp32"),
        )
    ]
    return train_rows, score_rows


def to_markdown(train_rows: list[dict], score_rows: list[dict]) -> str:
    ours = train_rows[0]
    lines = [
        "Fine-tuning (train):",
        "",
        "| method | precision | steps | examples | seconds | examples/s | padding share | peak RSS (MB) | ours / this (examples/s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in train_rows:
        lines.append(
            f"| {r['method']} | {r['precision']} | {r['steps']} | {r['examples']} | {r['train_seconds']} | {r['examples_per_s']} | "
            f"{r['padding_share']:.1%} | {r['peak_rss_mb']} | {ours['examples_per_s'] / r['examples_per_s']:.2f} |"
        )
    ours = score_rows[0]
    lines += [
        "",
        "Scoring (every test split, batches of 64, forward only):",
        "",
        "| method | precision | examples | seconds | examples/s | peak RSS (MB) | ours / this (examples/s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in score_rows:
        lines.append(
            f"| {r['method']} | {r['precision']} | {r['examples']} | {r['seconds']} | {r['examples_per_s']} | {r['peak_rss_mb']} | "
            f"{ours['examples_per_s'] / r['examples_per_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        train_rows, score_rows = bench(args.steps, Path(tmp))
    save_results(
        "finetune",
        f"--steps {args.steps}",
        "Same model (all-MiniLM-L6-v2), the four demo tasks, batch 16, same task draws "
        "(seed 13), HF Trainer on CPU; padding share = pad tokens / all tokens fed to the encoder.",
        to_markdown(train_rows, score_rows),
        {"train": train_rows, "score": score_rows},
    )


if __name__ == "__main__":
    main()
