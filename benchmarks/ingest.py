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
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def make_corpus(path: Path, megabytes: int, seed: int = 0) -> int:
    """Write ~``megabytes`` MB of JSONL documents; return the document count."""
    sys.path.insert(0, str(ROOT))
    from pipeline.core.config import load_config
    from pipeline.text.demo_domain import build_world, iter_corpus

    cfg = load_config(ROOT / "params.yaml", {"demo.corpus_docs": 9000}).demo
    base = [d["text"] for d in iter_corpus(build_world(cfg), cfg, random.Random(seed))]
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    written = docs = copy = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            for text in base:
                if copy:
                    text = f"{text} Trial registry copy {copy}."
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                if rng.random() < 0.03:
                    line += line  # a verbatim duplicate
                    docs += 1
                f.write(line)
                written += len(line.encode("utf-8"))
                docs += 1
                if written >= target:
                    break
            copy += 1
    return docs


def _measure(code: str, *args: str) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter; return wall seconds and peak RSS (MB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"benchmark child failed:\n{out}\n{err}")
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "output": out.strip()}


def measured_row(
    method: str, code: str, *args: str, rates: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """One table row: ``code`` (whose last output line is a JSON object) run by :func:`_measure`, that object,
    the figures ``rates`` derives from it, and the peak RSS (MB); echoed to stderr as it comes."""
    m = _measure(code, *args)
    info = json.loads(m.pop("output").splitlines()[-1])
    row = {"method": method, **info, **rates(info), "peak_rss_mb": round(m["peak_rss_mb"])}
    print(json.dumps(row), file=sys.stderr)
    return row


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
            m = _measure(code, str(corpus), str(out))
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


def save_results(name: str, args: str, note: str, table: str, rows: Any = None) -> None:
    """Print ``table`` and keep it, with the command and machine, in ``benchmarks/results/<name>.md``
    (and the raw ``rows`` in ``<name>.json``, which ``python -m benchmarks report`` reads)."""
    from pipeline.modelling.precision import detect_hardware

    machine = detect_hardware().describe()
    header = (
        f"# {name} benchmark\n\n`python -m benchmarks.{name} {args}` on {machine}, {os.cpu_count()} CPU cores, "
        f"{time.strftime('%Y-%m-%d')}. {note}\n\n"
    )
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{name}.md").write_text(header + table + "\n", encoding="utf-8")
    if rows is not None:
        meta = {
            "command": f"python -m benchmarks.{name} {args}".strip(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine,
            "cpu_count": os.cpu_count(),
        }
        (HERE / "results" / f"{name}.json").write_text(
            json.dumps({**meta, "rows": rows}, indent=1) + "\n", encoding="utf-8"
        )
    print(table)


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
