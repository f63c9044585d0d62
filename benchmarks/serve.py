"""Benchmark: serving the multi-task model, batched per task vs one row per call.

    dvc repro                                     # models/finetuned and data/tasks must exist
    python -m benchmarks.serve                    # 64 test rows per task (~2 minutes on 2 cores)
    python -m benchmarks.serve --rows 128

Both variants run the registered model's code path (:class:`pipeline.serving.service.Predictor`, what the
MLflow pyfunc calls) on the same mixed request of real test rows of every task, each in a fresh
process:

1. ours: the whole DataFrame in one ``predict`` call: rows grouped by task, length-sorted batches
   of ``evaluate.batch_size``, dynamic padding;
2. one row per call: what a client sending one request per example gets (the obvious
   alternative); its per-call times give the single-request latency (p50 / p95).

Results: ``benchmarks/results/serve.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.harness import ROOT, measured_row, save_results

RUN = """
import sys, json, time
from pathlib import Path
import numpy as np
from pipeline.core.config import load_config
from pipeline.serving.service import Predictor, requests_from_tasks
root, variant, per_task = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
cfg = load_config(root / "params.yaml")
frame = requests_from_tasks(root / "data" / "tasks", per_task)
predictor = Predictor(root / "models" / "finetuned", cfg.tokenize.max_seq_length, cfg.tokenize.doc_stride, cfg.evaluate.batch_size,
                      cfg.precision)
predictor.predict(frame.iloc[:4])  # warm-up (first-call allocations)
start = time.perf_counter()
latencies = []
if variant == "batched":
    predictor.predict(frame)
else:
    for i in range(len(frame)):
        t = time.perf_counter()
        predictor.predict(frame.iloc[[i]])
        latencies.append(time.perf_counter() - t)
seconds = time.perf_counter() - start
out = {"rows": len(frame), "seconds": round(seconds, 2)}
if latencies:
    out.update(p50_ms=round(float(np.percentile(latencies, 50)) * 1000, 1), p95_ms=round(float(np.percentile(latencies, 95)) * 1000, 1))
print(json.dumps(out))
"""


def bench(root: Path, per_task: int) -> list[dict]:
    return [
        measured_row(
            name,
            RUN,
            str(root),
            variant,
            str(per_task),
            rates=lambda i: {"rows_per_s": round(i["rows"] / i["seconds"], 1)},
        )
        for name, variant in (("ours: one call, batched per task", "batched"), ("one row per call", "single"))
    ]


def to_markdown(rows: list[dict]) -> str:
    ours = rows[0]
    lines = [
        "| method | rows | seconds | rows/s | latency p50 / p95 per call (ms) | peak RSS (MB) | ours / this (rows/s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        latency = f"{r['p50_ms']} / {r['p95_ms']}" if "p50_ms" in r else "-"
        lines.append(
            f"| {r['method']} | {r['rows']} | {r['seconds']} | {r['rows_per_s']} | {latency} | {r['peak_rss_mb']} | "
            f"{ours['rows_per_s'] / r['rows_per_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="test rows per task")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="project with models/finetuned and data/tasks (default: this checkout)"
    )
    args = parser.parse_args()
    if not (args.root / "models" / "finetuned" / "tasks.json").exists():
        sys.exit(f"no fine-tuned model under {args.root}/models/finetuned: run `dvc repro` first")
    rows = bench(args.root, args.rows)
    save_results(
        "serve",
        f"--rows {args.rows}",
        "The model of the default `dvc repro` (all-MiniLM-L6-v2, four demo tasks), real test rows "
        "of every task in one mixed request, CPU, one process each.",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
