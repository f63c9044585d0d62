"""Benchmark: ingest throughput and peak memory vs the naive pandas approach, same files, same run.

    python -m benchmarks.ingest                  # 10 MB, 100 MB, 1 GB (about 10 minutes on 2 cores)
    python -m benchmarks.ingest --sizes 10 100   # quicker

Corpora are made from the demo generator: a ~10 MB base of trial reports, repeated with a
per-copy perturbation (so copies are distinct documents) plus 3% verbatim duplicates (so
dedup has work). Each measurement runs in its own subprocess; peak RSS is that process's
``ru_maxrss``. The naive baseline is ``pandas.read_json(lines=True)`` + ``drop_duplicates``
+ ``to_parquet``: the obvious way to do this, without normalisation, filters or splits.
Results: a Markdown table on stdout and in ``benchmarks/results/ingest.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import make_corpus, measure, save_results

OURS = """
import sys, json
from pathlib import Path
from pipeline.core.config import load_config
from pipeline.core.paths import Paths
from pipeline.stages import ingest
src, out = sys.argv[1], Path(sys.argv[2])
cfg = load_config("params.yaml", {"ingest.corpus.sources": [{"type": "files", "path": src}], "ingest.tasks": [], "finetune.tasks": {},
                                  "ingest.corpus.min_chars": 1, "ingest.corpus.min_words": 1})
r = ingest.run(cfg, Paths(out))["corpus"]
print(json.dumps({"kept": r["documents_kept"], "read": r["documents_read"]}))
"""

NAIVE = """
import sys, json
import pandas as pd
src, out = sys.argv[1], sys.argv[2]
df = pd.read_json(src, lines=True)
read = len(df)
df = df.drop_duplicates("text")
df.to_parquet(out + "/corpus.parquet")
print(json.dumps({"kept": len(df), "read": read}))
"""


def bench(sizes: list[int], workdir: Path) -> list[dict[str, float]]:
    rows = []
    for mb in sizes:
        corpus = workdir / f"corpus_{mb}mb.jsonl"
        docs = make_corpus(corpus, mb)
        size_mb = corpus.stat().st_size / 1e6
        for name, code in (("adaptbert ingest", OURS), ("pandas read_json + drop_duplicates", NAIVE)):
            out = Path(tempfile.mkdtemp(dir=workdir))
            m = measure(code, str(corpus), str(out))
            counts = json.loads(m.pop("output").splitlines()[-1])
            rows.append(
                {
                    "size_mb": round(size_mb, 1),
                    "docs": docs,
                    "method": name,
                    **counts,
                    "seconds": round(m["seconds"], 2),
                    "mb_per_s": round(size_mb / m["seconds"], 2),
                    "docs_per_s": round(docs / m["seconds"]),
                    "peak_rss_mb": round(m["peak_rss_mb"]),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
        corpus.unlink()
    return rows


def to_markdown(rows: list[dict[str, float]]) -> str:
    lines = [
        "| corpus | docs | method | kept | seconds | MB/s | docs/s | peak RSS (MB) | time ratio (naive/ours) | RSS ratio (naive/ours) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ours, naive in zip(rows[::2], rows[1::2], strict=True):
        for r in (ours, naive):
            ratio_t = f"{naive['seconds'] / ours['seconds']:.2f}" if r is ours else ""
            ratio_m = f"{naive['peak_rss_mb'] / ours['peak_rss_mb']:.2f}" if r is ours else ""
            lines.append(
                f"| {r['size_mb']} MB | {r['docs']} | {r['method']} | {r['kept']} | {r['seconds']} | {r['mb_per_s']} | "
                f"{r['docs_per_s']} | {r['peak_rss_mb']} | {ratio_t} | {ratio_m} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000], help="corpus sizes in MB")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        rows = bench(args.sizes, Path(tmp))
    save_results(
        "ingest",
        f"--sizes {' '.join(map(str, args.sizes))}",
        "Ours normalises (NFKC, controls, whitespace), filters, "
        "deduplicates, splits and writes Parquet; the naive baseline only parses, deduplicates and writes.",
        to_markdown(rows),
        rows,
    )


if __name__ == "__main__":
    main()
