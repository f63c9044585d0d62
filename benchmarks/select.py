"""Benchmark: the select stage (kNN-TAPT corpus selection) against embedding everything and one similarity matrix.

    python -m benchmarks.select                                   # this project (the demo corpus after dvc repro)
    python -m benchmarks.select --root .study/biomed_labels/data  # the biomed corpus, as a study tokenized it

On the tokenized corpus blocks and the tasks' train inputs of the project at ``--root`` (its
``data/tokenized``, ``models/tokenizer`` and ``data/tasks``, as ``dvc repro tokenize`` leaves them), each method finds every train
input's ``k`` nearest blocks (``pretrain.selection.k``) with the offline all-MiniLM-L6-v2:

- ours, as the stage runs (:func:`pipeline.modelling.selection.select_nearest`): the corpus streamed in shards,
  a running top-k, embeddings cached per shard; ``precision: auto`` (bf16 where the CPU has it), an empty cache;
- ours again on the cache the first row filled (a re-run: nothing is embedded);
- ours in fp32, an empty cache;
- the obvious alternative: every block and query embedded in fp32 into one matrix each, one
  queries x blocks similarity matrix, ``topk`` per query (memory grows with queries x blocks).

Each method runs in a fresh process (peak RSS = its ``ru_maxrss``, model loading included). ``agreement``
is the Jaccard overlap of a method's selected blocks with the alternative's (fp32, exact). Results:
``benchmarks/results/select.md``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.harness import ROOT, measured_row, save_results

# argv: method, project root, cache dir, k, max blocks. Prints {"blocks", "queries", "seconds", "selected", "embedded"}.
CODE = """
import sys, json, time
from pathlib import Path
import numpy as np
import torch
from transformers import AutoTokenizer
from pipeline.modelling.models import resolve_base
from pipeline.modelling.precision import resolve_precision
from pipeline.modelling import selection as sel
from pipeline.core.io import file_digest
from pipeline.modelling.shards import open_group
from pipeline.core.paths import Paths
from pipeline.stages.select import embed_queries
method, paths, cache_dir, k, max_blocks = sys.argv[1], Paths(Path(sys.argv[2])), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
blocks, _ = open_group(paths.pretrain_blocks, "train")
blocks = blocks.select(range(min(max_blocks, len(blocks)))) if max_blocks else blocks
tok = AutoTokenizer.from_pretrained(paths.tokenizer)
precision = resolve_precision("fp32" if method in ("fp32", "naive") else "auto")
start = time.perf_counter()
embedder = sel.Embedder(resolve_base("minilm", "pretrain.selection.embedder"), precision, 64)
if method == "naive":
    from pipeline.tasks.encoding import task_train_inputs
    queries = torch.from_numpy(embedder.embed_texts([t for _, t in task_train_inputs(paths.tasks)]))
    same = tok.get_vocab() == embedder.tokenizer.get_vocab()
    corpus = torch.from_numpy(embedder.embed_ids(sel.to_embedder_ids(blocks[:]["input_ids"], tok, embedder, same)))
    sims = queries @ corpus.T  # [queries, blocks] fp32, all at once
    chosen = np.unique(sims.topk(min(k, len(corpus)), dim=1).indices.numpy())
    embedded = len(corpus)
else:
    cache = sel.EmbeddingCache(cache_dir)
    queries, _ = embed_queries(paths.tasks, embedder, cache)
    digest = file_digest(paths.tokenizer / "tokenizer.json")
    result = sel.select_nearest(blocks, queries, k, tok, digest, embedder, cache)
    chosen, embedded = result.blocks, result.cache_misses
seconds = time.perf_counter() - start
np.save(cache_dir.parent / f"{method}.npy", chosen)
print(json.dumps({"blocks": len(blocks), "queries": len(queries), "seconds": round(seconds, 2),
                  "selected": int(len(chosen)), "embedded": int(embedded), "precision": precision.name}))
"""

METHODS = {
    "ours": "ours: streamed shards, running top-k, empty cache",
    "cached": "ours: a re-run on that cache (nothing embedded)",
    "fp32": "ours in fp32, empty cache",
    "naive": "embed everything (fp32), one similarity matrix, topk",
}


def jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / max(len(a | b), 1)


def bench(root: Path, k: int, max_blocks: int, workdir: Path) -> list[dict]:
    """One row per method, each in its own process; ``cached`` reuses ``ours``'s cache."""
    import numpy as np

    rows = []
    for method, title in METHODS.items():
        cache = workdir / ("ours" if method == "cached" else method) / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        row = measured_row(
            title,
            CODE,
            method,
            str(root.resolve()),
            str(cache),
            str(k),
            str(max_blocks),
            rates=lambda r: {"blocks_per_s": round(r["blocks"] / max(r["seconds"], 1e-9))},
        )
        row["key"] = method
        rows.append(row)
    exact = set(np.load(workdir / "naive" / "naive.npy").tolist())
    for row in rows:
        chosen = workdir / ("ours" if row["key"] == "cached" else row["key"]) / f"{row['key']}.npy"
        row["agreement"] = round(jaccard(set(np.load(chosen).tolist()), exact), 4)
    naive = rows[-1]
    for row in rows:
        row["speed_vs_naive"] = round(row["blocks_per_s"] / naive["blocks_per_s"], 2)
        row["rss_naive_over_this"] = round(naive["peak_rss_mb"] / row["peak_rss_mb"], 2)
    return rows


def to_markdown(rows: list[dict]) -> str:
    """The table of ``bench``'s rows."""
    lines = [
        "| method | precision | blocks | train inputs | cache misses (shards + queries) | seconds | blocks/s | selected | agreement "
        "with the exact selection | peak RSS (MB) | speed vs the alternative | alternative's RSS / this |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        misses = "no cache" if r["key"] == "naive" else str(r["embedded"])
        lines.append(
            f"| {r['method']} | {r['precision']} | {r['blocks']} | {r['queries']} | {misses} | {r['seconds']} | "
            f"{r['blocks_per_s']} | {r['selected']} | {r['agreement']:.4f} | {r['peak_rss_mb']} | "
            f"{r['speed_vs_naive']:.2f}x | {r['rss_naive_over_this']:.2f}x |"
        )
    return "\n".join(lines)


def shown_path(path: Path) -> str:
    """``path`` relative to the project root where it lies inside it (no machine's home in the results)."""
    resolved = path.resolve()
    return (
        str(resolved.relative_to(ROOT))
        if resolved.is_relative_to(ROOT) and resolved != ROOT
        else ("." if resolved == ROOT else str(path))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="a project root after tokenize")
    parser.add_argument("--k", type=int, default=20, help="nearest blocks per train input (pretrain.selection.k)")
    parser.add_argument("--max-blocks", type=int, default=0, help="only the first N corpus blocks (0: all)")
    args = parser.parse_args()
    if not (args.root / "data" / "tokenized" / "pretrain" / "manifest.json").exists():
        raise SystemExit(
            f"benchmarks.select: {args.root}/data/tokenized/pretrain/manifest.json not found: dvc repro tokenize"
        )
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(args.root, args.k, args.max_blocks, Path(tmp))
    save_results(
        "select",
        " ".join(
            [f"--root {shown_path(args.root)}", f"--k {args.k}"]
            + ([f"--max-blocks {args.max_blocks}"] if args.max_blocks else [])
        ),
        "Every train input of every task is a query; the selected blocks are the union of each query's k nearest. "
        "Embedding time and model loading are inside the seconds.",
        to_markdown(rows),
        rows,
    )
    print(json.dumps(rows[0]))


if __name__ == "__main__":
    main()
