"""Benchmark: ELECTRA's replaced-token detection against masked-LM pretraining, per step and per token.

    python -m benchmarks.electra                 # 12 optimiser steps per run, 3 rounds (~2 minutes on 2 AMX Xeon cores, ~6 on an EPYC in fp32)
    python -m benchmarks.electra --steps 20 --rounds 5

Both run the pretrain stage (``pipeline.stages.pretrain.run``) with ``params.yaml``'s defaults on the demo corpus
(MiniLM, batch 16 x 128, token masking, the machine's ``precision: auto``), each in a fresh process, alternating
MLM and ELECTRA round by round so that other work on the machine hits both alike; each figure is the median over
the rounds. ELECTRA's step adds a 2-layer generator and the discriminator's pass over the corrupted block to the
encoder's: what it costs per token is what a run at equal minutes gives up in tokens seen, against a training
signal at every token instead of 15%. Model FLOP/s count each objective's own matrix products
(:mod:`pipeline.modelling.flops`), as a share of the machine's matmul peak measured in the same run.
Results: ``benchmarks/results/electra.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, measure, save_results
from benchmarks.pretrain import OURS, PREPARE, matmul_peak, model_shapes, peak_of
from pipeline.modelling.flops import electra_train_flops_per_token, mlm_train_flops_per_token

OBJECTIVES: list[tuple[str, dict[str, Any]]] = [
    ("masked LM (defaults)", {}),
    ("ELECTRA (generator 1/3 of the layers, lambda 50)", {"pretrain.objective": "electra"}),
]


def run_rounds(steps: int, rounds: int, project: Path) -> dict[str, list[dict[str, Any]]]:
    """Each objective ``rounds`` times, alternating; the stage's own report figures plus peak RSS per run."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in OBJECTIVES}
    for round_no in range(rounds):
        for name, overrides in OBJECTIVES:
            m = measure(OURS, str(project), str(steps), json.dumps(overrides))
            info = json.loads(m.pop("output").splitlines()[-1])
            info["peak_rss_mb"] = round(m["peak_rss_mb"])
            runs[name].append(info)
            print(json.dumps({"round": round_no, "objective": name, **info}), file=sys.stderr)
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]], flops: dict[str, float], peak: float) -> list[dict[str, Any]]:
    """One row per objective: medians over the rounds, model FLOP/s and its share of ``peak``."""
    rows = []
    for name, infos in runs.items():
        tokens_per_s = statistics.median(i["warm_tokens_per_s"] for i in infos)
        tokens_per_step = infos[0]["real_tokens"] / infos[0]["steps"]
        rows.append(
            {
                "objective": name,
                "precision": infos[0]["precision"],
                "rounds": len(infos),
                "warm_tokens_per_s": round(tokens_per_s),
                "warm_s_per_step": round(tokens_per_step / tokens_per_s, 3),
                "spread_tokens_per_s": [
                    min(i["warm_tokens_per_s"] for i in infos),
                    max(i["warm_tokens_per_s"] for i in infos),
                ],
                "peak_rss_mb": max(i["peak_rss_mb"] for i in infos),
                "model_gflop_per_token": round(flops[name] / 1e9, 4),
                "model_gflop_per_s": round(flops[name] * tokens_per_s / 1e9, 1),
                "peak_share": round(flops[name] * tokens_per_s / peak, 3),
            }
        )
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    mlm = rows[0]
    lines = [
        "| objective | precision | warm s/step | warm real tokens/s (min-max) | vs masked LM | peak RSS (MB) "
        "| model GFLOP per token | model GFLOP/s | share of matmul peak |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        low, high = r["spread_tokens_per_s"]
        lines.append(
            f"| {r['objective']} | {r['precision']} | {r['warm_s_per_step']} | {r['warm_tokens_per_s']} ({low}-{high}) | "
            f"{r['warm_tokens_per_s'] / mlm['warm_tokens_per_s']:.2f} | {r['peak_rss_mb']} | {r['model_gflop_per_token']} | "
            f"{r['model_gflop_per_s']} | {r['peak_share']:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    from transformers import AutoConfig

    from pipeline.core.config import load_config
    from pipeline.modelling.electra import generator_layers
    from pipeline.modelling.models import resolve_base
    from pipeline.modelling.precision import resolve_precision

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    bf16 = resolve_precision("auto").bf16
    config = AutoConfig.from_pretrained(resolve_base("minilm", "base"))
    electra = load_config(ROOT / "params.yaml").pretrain.electra
    layers = generator_layers(config.num_hidden_layers, electra.generator_fraction)
    flops = {
        OBJECTIVES[0][0]: mlm_train_flops_per_token(config, 128),
        OBJECTIVES[1][0]: electra_train_flops_per_token(config, 128, layers),
    }
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        project = Path(tmp) / "project"
        measure(PREPARE, str(project))
        rates = matmul_peak(model_shapes(config), bf16)
        runs = run_rounds(args.steps, args.rounds, project)
    rows = summarise(runs, flops, peak_of(rates, runs[OBJECTIVES[0][0]][0]["precision"]))
    save_results(
        "electra",
        f"--steps {args.steps} --rounds {args.rounds}",
        f"The pretrain stage with params.yaml's defaults (all-MiniLM-L6-v2, batch 16 x 128, token masking); ELECTRA with "
        f"a {layers}-layer generator. Median of {args.rounds} alternating rounds; warm = after the first 2 steps.",
        to_markdown(rows),
        {"rows": rows, "runs": runs},
    )


if __name__ == "__main__":
    main()
