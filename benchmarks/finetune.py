"""Benchmark: multi-task fine-tuning with length-bucketed dynamic padding vs padding to max length.

    python -m benchmarks.finetune                # 60 optimiser steps per variant, 2 rounds (~8 minutes on 2 cores)
    python -m benchmarks.finetune --steps 100 --rounds 3

All variants train all-MiniLM-L6-v2 (offline) with the four demo tasks through the finetune
stage's own Trainer and training kernels (same sampler draws, seed, batch 16, LLRD, no dev
evaluation), each in a fresh process, every variant once per round (interleaved), its fastest round kept:

1. ours: single-task batches from length buckets (``finetune.bucket_batches: 50``), padded to
   the longest example of the batch, eager attention and NumPy-drawn dropout masks on a CPU
   (``pipeline.modelling.dropout``), in the precision ``auto`` picks and in fp32;
2. the same with PyTorch's own dropout (``torch.nn.Dropout``; eager attention in bf16, SDPA in fp32):
   what the stage ran before;
3. dynamic padding without buckets (``bucket_batches: 1``): what ``DataCollatorWithPadding``
   over shuffled examples gives;
4. padding to max length (128): ``run_glue.py --pad_to_max_length``, the obvious alternative.

Then scoring speed: every test split scored by ``score_task`` (length-sorted batches of 64,
dynamic padding) against the same batches padded to 128. Results: ``benchmarks/results/finetune.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT, best_of_rounds, measure, measured_row, save_results

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
kernels = sys.argv[6] if len(sys.argv) > 6 else "ours"  # ours: the stage's | torch: PyTorch's dropout, the kernel before
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
from pipeline.modelling.precision import attention_kernel
from pipeline.modelling.dropout import training_kernels
start = time.perf_counter()
with (training_kernels(model, precision) if kernels == "ours" else attention_kernel(model, "eager" if precision.bf16 else "sdpa")):
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


def bench(steps: int, workdir: Path, rounds: int) -> tuple[list[dict], list[dict]]:
    project = workdir / "project"
    measure(PREPARE, str(project))
    jobs = [
        ("ours: length buckets + dynamic padding, precision auto", "bucketed", "auto", "ours"),
        ("ours with PyTorch's dropout (before), precision auto", "bucketed", "auto", "torch"),
        ("ours in fp32", "bucketed", "fp32", "ours"),
        ("ours in fp32 with PyTorch's dropout and SDPA (before)", "bucketed", "fp32", "torch"),
        ("dynamic padding, no buckets, fp32", "dynamic", "fp32", "torch"),
        ("padding to max length 128, fp32", "max_length", "fp32", "torch"),
    ]

    def run(job: tuple[str, str, str, str]) -> dict:
        name, variant, precision, kernels = job
        m = measure(TRAIN, str(project), variant, precision, str(steps), "{}", kernels)
        info = json.loads(m.pop("output").splitlines()[-1])
        return {
            "method": name,
            **info,
            "examples_per_s": round(info["examples"] / info["train_seconds"], 1),
            "padding_share": round(1 - info["real_tokens"] / info["padded_tokens"], 3),
            "peak_rss_mb": round(m["peak_rss_mb"]),
        }

    train_rows = best_of_rounds(rounds, jobs, run, "train_seconds")
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
    parser.add_argument("--rounds", type=int, default=2, help="each training variant this many times, interleaved")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        train_rows, score_rows = bench(args.steps, Path(tmp), args.rounds)
    save_results(
        "finetune",
        f"--steps {args.steps} --rounds {args.rounds}",
        "Same model (all-MiniLM-L6-v2), the four demo tasks, batch 16, same task draws "
        "(seed 13), HF Trainer on CPU; padding share = pad tokens / all tokens fed to the encoder.",
        to_markdown(train_rows, score_rows),
        {"train": train_rows, "score": score_rows},
    )


if __name__ == "__main__":
    main()
