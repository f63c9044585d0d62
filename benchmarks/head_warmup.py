"""Benchmark: what a head warm-up step costs (``pretrain.head_warmup_steps``) against a full step.

    python -m benchmarks.head_warmup                  # ~2 minutes on 2 cores

One process, the three kinds of step interleaved (so that other work on the machine slows each alike), on the
model and batch of ``benchmarks.pretrain``'s step scripts (all-MiniLM-L6-v2 with a fresh masked-only MLM head,
16 x 128 tokens, fused AdamW, bf16 autocast where the CPU has fast bf16):

- ``full``: a training step of the whole model;
- ``head only (ours)``: the encoder's parameters need no gradient while the head warms up
  (``PretrainTrainer.freeze_encoder``): its forward pass records nothing, no backward runs through it;
- ``head only, gradients dropped``: the obvious way, and ours before: the full backward, then the encoder's
  gradients set to ``None`` before clipping and the optimiser step.

Reports the median seconds per step of each (after two warm-up steps) and the ratios.
Results: ``benchmarks/results/head_warmup.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks.harness import save_results
from benchmarks.pretrain import minilm_mlm, random_masked_batch

KINDS = ("full", "head only (ours)", "head only, gradients dropped")


def step(model: Any, opt: Any, batch: dict[str, Any], autocast: bool, kind: str) -> float:
    """Seconds of one optimiser step of ``kind`` (the encoder's ``requires_grad`` set as the kind wants)."""
    import torch

    frozen = kind == "head only (ours)"
    for param in model.bert.parameters():
        param.requires_grad_(not frozen)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**batch).loss
    loss.backward()
    if kind != "full":
        for param in model.bert.parameters():
            param.grad = None
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def bench(steps: int) -> list[dict[str, Any]]:
    """Median seconds per step of each kind, the kinds taking turns step by step."""
    import torch

    from pipeline.modelling.precision import resolve_precision

    autocast = resolve_precision("auto").bf16
    model = minilm_mlm("sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    batch = random_masked_batch()
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for i in range(steps + 2):
        for kind in KINDS:
            seconds = step(model, opt, batch, autocast, kind)
            if i >= 2:
                times[kind].append(seconds)
    full = statistics.median(times["full"])
    return [
        {
            "step": kind,
            "median_s": round(statistics.median(t), 4),
            "min_s": round(min(t), 4),
            "vs_full": round(statistics.median(t) / full, 3),
            "precision": "bf16 autocast" if autocast else "fp32",
        }
        for kind, t in times.items()
    ]


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| step | median s/step | min s/step | time vs a full step | precision |", "|---|---:|---:|---:|---|"]
    lines += [
        f"| {r['step']} | {r['median_s']} | {r['min_s']} | {r['vs_full']:.2f}x | {r['precision']} |" for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each kind (after 2 warm-up steps)")
    args = parser.parse_args()
    rows = bench(args.steps)
    save_results(
        "head_warmup",
        f"--steps {args.steps}",
        "all-MiniLM-L6-v2 + a fresh masked-only MLM head, 16 x 128 random tokens (15% masked), fused AdamW; the "
        "three kinds of step interleaved in one process.",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
