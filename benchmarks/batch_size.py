"""Benchmark: masked-LM training throughput at 16, 32 and 64 blocks per optimiser step (issue 60, item 4).

    python -m benchmarks.batch_size                 # ~3 minutes on 2 cores in fp32
    python -m benchmarks.batch_size --steps 6 --sizes 16 32

A step's cost has a part that grows with the batch (the model's forward and backward) and a part that does not
(AdamW over 22.7M parameters, clipping, zero fills, master-weight casts under bf16). A larger batch spreads the
second over more tokens: how much more it trains per second is what this measures. One process, the stage's model
(all-MiniLM-L6-v2 with a fresh masked-only MLM head), attention kernel and precision (``precision: auto``), fused
AdamW; the sizes take turns step by step, so other work on the machine slows each alike. Reports the median seconds
per step after two warm-up steps, tokens per second and the ratio to 16 blocks (of medians and of minima) (the profiles' batch).
Whether the extra tokens are worth as much per token is the other half: ``studies/pretrain_batch.py`` trains each
size for the same minutes and compares held-out perplexity. Results: ``benchmarks/results/batch_size.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks.harness import save_results
from benchmarks.pretrain import minilm_mlm, random_masked_batch, train_step

BLOCK = 128  # tokens per block


def bench(sizes: list[int], steps: int) -> list[dict[str, Any]]:
    """Median seconds per optimiser step at each batch size, the sizes taking turns."""
    import torch

    from pipeline.modelling.dropout import register_attention
    from pipeline.modelling.precision import resolve_precision

    register_attention()  # the stage's CPU attention kernel is registered with transformers by name
    precision = resolve_precision("auto")
    model = minilm_mlm(precision.training_attention)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    batches = {size: random_masked_batch(size) for size in sizes}
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for i in range(steps + 2):
        for size in sizes:
            start = time.perf_counter()
            train_step(model, opt, batches[size], precision.bf16)
            if i >= 2:  # the first two build kernels
                times[size].append(time.perf_counter() - start)
    rates = {size: size * BLOCK / statistics.median(t) for size, t in times.items()}
    best = {size: size * BLOCK / min(t) for size, t in times.items()}
    return [
        {
            "blocks_per_step": size,
            "median_s": round(statistics.median(t), 3),
            "min_s": round(min(t), 3),
            "tokens_per_s": round(rates[size]),
            "vs_first": round(rates[size] / rates[sizes[0]], 3),
            "vs_first_best": round(best[size] / best[sizes[0]], 3),
            "precision": precision.name,
        }
        for size, t in times.items()
    ]


def to_markdown(rows: list[dict[str, Any]]) -> str:
    first = rows[0]["blocks_per_step"]
    lines = [
        f"| blocks per step (x {BLOCK} tokens) | median s/step | min s/step | tokens/s | tokens/s vs {first} (median / min) "
        "| precision |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['blocks_per_step']} | {r['median_s']} | {r['min_s']} | {r['tokens_per_s']:,} | {r['vs_first']:.2f}x / {r['vs_first_best']:.2f}x "
        f"| {r['precision']} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each size (after 2 warm-up steps)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64], help="blocks per optimiser step")
    args = parser.parse_args()
    rows = bench(args.sizes, args.steps)
    save_results(
        "batch_size",
        f"--steps {args.steps} --sizes {' '.join(map(str, args.sizes))}",
        "all-MiniLM-L6-v2 + a fresh masked-only MLM head, random tokens (15% masked) in blocks of 128, fused AdamW, "
        "the stage's attention kernel and precision; the sizes interleaved step by step in one process.",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
