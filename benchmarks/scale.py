"""Benchmark: ingest with exact and near-duplicate removal (and tokenize) at 0.1, 1 and 10 GB: the local engine with
either index, and the Ray engine.

    python -m benchmarks.scale                          # 0.1, 1 and 10 GB, every engine (about an hour on 2 cores)
    python -m benchmarks.scale --sizes 0.1 1            # quicker
    python -m benchmarks.scale --sizes 0.1 1 --tokenize # and the tokenize stage after ingest, on the same engine
    python -m benchmarks.scale --engines local disk     # the local engine's two indexes only

Each corpus is generated on the fly (``benchmarks.harness.make_sharded_corpus``: distinct enciphered demo
reports in 64 MB JSONL files, 3% exact and 1% near duplicates), never kept. Each engine (``local``; ``disk``: the
local engine with ``ingest.index: disk``; ``ray``) runs ``ingest.run`` with the repository's params (near-duplicates
and decontamination on, no tasks) in a fresh process, then (``--tokenize``) ``tokenize.run`` in another with
``tokenize.engine`` the same engine, one engine after the other in the same run; the Ray engine starts its own local
Ray on every core. Memory is sampled every 0.2 s over the whole process tree (the driver, and Ray's raylet, object
store and workers): the largest process's peak RSS and the peak of their sum (shared pages count once per process
that maps them). Cost per GB and documents/s come from the wall time of the whole process (Python and Ray start-up
included). Results: ``benchmarks/results/scale.md`` (with ``--tokenize``: ``scale-tokenize.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, make_sharded_corpus, save_results

STAGE = """
import sys, json
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import ingest, tokenize
src, out, engine, stage = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
index, engine = ("disk", "local") if engine == "disk" else ("memory", engine)  # disk: the local engine, its index on disk
cfg = load_config("params.yaml", {"ingest.corpus.sources": [{"type": "files", "path": src}], "ingest.tasks": [],
                                  "finetune.tasks": {}, "ingest.engine": engine, "tokenize.engine": engine,
                                  "ingest.index": index,
                                  "tokenize.domain_terms": None})
if stage == "ingest":
    r = ingest.run(cfg, Paths(out))
    info = {"read": r["corpus"]["documents_read"], "kept": r["corpus"]["documents_kept"],
            "near": r["corpus"]["dropped"].get("near_duplicate", 0), "steps": r["engine_seconds"]}
else:  # tokenize what ingest kept: the vocabulary, then the block shards on the same engine
    t = tokenize.run(cfg, Paths(out), require_validation=False)
    info = {"tokens": t.tokens, "shards": t.shards, "pack_s": (t.seconds or {})["pack_s"]}
print(json.dumps(info))
"""


def run_sampled(args: list[str]) -> dict[str, Any]:
    """Run a child Python; wall seconds, the largest process's peak RSS and the process tree's peak total RSS (MB)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGE, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    parent = psutil.Process(proc.pid)
    largest = total = 0
    while proc.poll() is None:
        rss = []
        for p in [parent, *parent.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # a worker that just ended
                rss.append(p.memory_info().rss)
        largest, total = max(largest, max(rss, default=0)), max(total, sum(rss))
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{out[-2000:]}\n{err[-4000:]}")
    return {
        "seconds": time.perf_counter() - start,
        "largest_rss_mb": largest / 2**20,
        "total_rss_mb": total / 2**20,
        **json.loads(out.strip().splitlines()[-1]),
    }


def bench(sizes: list[float], engines: list[str], tokenize: bool, workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for gb in sizes:
        corpus = workdir / f"corpus_{gb}gb"
        docs = make_sharded_corpus(corpus, int(gb * 1000))
        size_gb = sum(p.stat().st_size for p in corpus.iterdir()) / 1e9
        for engine in engines:
            project = workdir / f"project_{engine}"
            where = {"size_gb": round(size_gb, 2), "files": len(list(corpus.iterdir())), "docs": docs, "engine": engine}
            try:
                m = run_sampled([str(corpus / "*.jsonl"), str(project), engine, "ingest"])
                t = run_sampled([str(corpus / "*.jsonl"), str(project), engine, "tokenize"]) if tokenize else None
            except RuntimeError as err:  # a failed run is a result too (e.g. out of disk while spilling): kept, said
                rows.append({**where, "failed": str(err).strip().splitlines()[-1][:300]})
                print(json.dumps(rows[-1]), file=sys.stderr)
                shutil.rmtree(project, ignore_errors=True)
                continue
            rows.append(
                {
                    **where,
                    "kept": m["kept"],
                    "near_duplicates": m["near"],
                    "seconds": round(m["seconds"], 1),
                    "seconds_per_gb": round(m["seconds"] / size_gb, 1),
                    "docs_per_s": round(docs / m["seconds"]),
                    "largest_rss_mb": round(m["largest_rss_mb"]),
                    "total_rss_mb": round(m["total_rss_mb"]),
                    "steps": m[
                        "steps"
                    ],  # the Ray engine's: start, read_dedup_sketch, banding_resolution, sort_and_write
                    **(
                        {
                            "tokens": t["tokens"],
                            "shards": t["shards"],
                            "tokenize_seconds": round(t["seconds"], 1),
                            "tokenize_seconds_per_gb": round(t["seconds"] / size_gb, 1),
                            "pack_tokens_per_s": round(t["tokens"] / t["pack_s"]),
                            "tokenize_largest_rss_mb": round(t["largest_rss_mb"]),
                            "tokenize_total_rss_mb": round(t["total_rss_mb"]),
                        }
                        if t
                        else {}
                    ),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
            shutil.rmtree(project)
        shutil.rmtree(corpus)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| corpus | files | docs | engine | kept | near-dups | seconds | s/GB | docs/s | largest process RSS (MB) "
        "| all processes RSS (MB) | time ratio (vs local) |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    local = {r["size_gb"]: r["seconds"] for r in rows if r["engine"] == "local" and "failed" not in r}
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['size_gb']} GB | {r['files']} | {r['docs']} | {r['engine']} | failed: {r['failed']} |")
            continue
        ratio = f"{r['seconds'] / local[r['size_gb']]:.2f}" if r["engine"] != "local" and r["size_gb"] in local else ""
        lines.append(
            f"| {r['size_gb']} GB | {r['files']} | {r['docs']} | {r['engine']} | {r['kept']} | {r['near_duplicates']} "
            f"| {r['seconds']} | {r['seconds_per_gb']} | {r['docs_per_s']} | {r['largest_rss_mb']} | "
            f"{r['total_rss_mb']} | {ratio} |"
        )
    if any("tokens" in r for r in rows):
        lines += [
            "",
            "tokenize after ingest (the vocabulary on the driver, then the block shards on the same engine):",
            "",
            "| corpus | engine | tokens | shards | seconds | s/GB | packing tokens/s | largest process RSS (MB) "
            "| all processes RSS (MB) | time ratio (ray/local) |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        local_t = {r["size_gb"]: r["tokenize_seconds"] for r in rows if r["engine"] == "local" and "tokens" in r}
        for r in rows:
            if "tokens" not in r:
                continue
            base = local_t.get(r["size_gb"]) if r["engine"] == "ray" else None
            t_ratio = f"{r['tokenize_seconds'] / base:.2f}" if base else ""
            lines.append(
                f"| {r['size_gb']} GB | {r['engine']} | {r['tokens']} | {r['shards']} | {r['tokenize_seconds']} | "
                f"{r['tokenize_seconds_per_gb']} | {r['pack_tokens_per_s']} | {r['tokenize_largest_rss_mb']} | "
                f"{r['tokenize_total_rss_mb']} | {t_ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1, 10], help="corpus sizes in GB")
    parser.add_argument("--engines", nargs="+", default=["local", "disk", "ray"], choices=["local", "disk", "ray"])
    parser.add_argument("--tokenize", action="store_true", help="also run the tokenize stage on each ingested corpus")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        rows = bench(args.sizes, args.engines, args.tokenize, Path(tmp))
    save_results(
        "scale-tokenize" if args.tokenize else "scale",  # kept apart: a run with tokenize does not replace one without
        f"--sizes {' '.join(map(str, args.sizes))}{' --tokenize' if args.tokenize else ''}"
        f"{'' if args.engines == ['local', 'disk', 'ray'] else ' --engines ' + ' '.join(args.engines)}",
        "ingest.run with exact and near-duplicate removal and decontamination on; local: the streamed engine, its "
        "indexes in RAM; disk: the local engine with ingest.index: disk; ray: the Ray engine on a local Ray of every "
        "core of this machine. Same input, same output files (the engines' outputs are byte-identical; "
        "tests/data/test_ingest_ray.py, tests/data/test_ingest_disk.py).",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
