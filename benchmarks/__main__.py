"""``python -m benchmarks all``: run every stage benchmark, then write ``BENCHMARKS.md``.

    python -m benchmarks all          # ~20 minutes on 2 cores (needs models/finetuned: `dvc repro` first)
    python -m benchmarks report       # only rebuild BENCHMARKS.md from benchmarks/results/*.json

Each benchmark runs in its own process and keeps its table in ``benchmarks/results/<name>.md``
and its raw rows in ``<name>.json``; the report gathers them with the machine, the date, the
ratios against the obvious alternative and the scaling tables. The GPU section comes from
``benchmarks/results/gpu.json`` (``python -m benchmarks.gpu_check`` on a GPU machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from benchmarks.harness import HERE, ROOT

RESULTS = HERE / "results"
REPORT = ROOT / "BENCHMARKS.md"

FULL = {
    "ingest": ["--sizes", "10", "100", "1000"],
    "tokenize": ["--sizes", "10", "30", "100"],
    "pretrain": ["--steps", "12", "--scale-sizes", "10", "30", "100"],
    "finetune": ["--steps", "30"],
    "serve": ["--rows", "32"],
    "compress": [],  # reads reports/compression.json of `dvc repro` (add --report biomed=... by hand)
    "recipes": ["--steps", "30", "--blocks", "4000"],  # what the options of docs/recipes.md cost
    "electra": ["--steps", "12", "--rounds", "3"],  # ELECTRA's step against MLM's (pretrain.objective)
    "head_warmup": ["--steps", "20"],  # a head-only step (pretrain.head_warmup_steps) against a full one
    "batch_size": ["--steps", "12"],  # masked-LM tokens/s at 16, 32 and 64 blocks per step
    "dedup": ["--copies", "1"],  # ingest's near-duplicate and contamination checks (needs ../shared/data/biomed)
    "decontamination": [],  # its recall on planted near-copies and flags on clean text (../shared/data/biomed)
    "select": [],  # kNN-TAPT corpus selection on data/ (needs `dvc repro tokenize`; --data for another corpus)
    "team_stack": ["--rounds", "3"],  # tracking and registering: local files vs PostgreSQL + S3 (needs PostgreSQL)
}
# not in `all`: python -m benchmarks.scale (0.1, 1 and 10 GB through both ingest engines, about 2 hours on 2 cores)


def run_all() -> list[str]:
    """Run every benchmark in a fresh process; return the ones that could not run, with why."""
    skipped = []
    for name, args in FULL.items():
        if name == "serve" and not (ROOT / "models" / "finetuned" / "tasks.json").exists():
            skipped.append("serve: no models/finetuned (run `dvc repro` first)")
            continue
        if name == "select" and not (ROOT / "data" / "tokenized" / "pretrain" / "manifest.json").exists():
            skipped.append("select: no data/tokenized (run `dvc repro tokenize` first)")
            continue
        if name == "compress" and not (ROOT / "reports" / "compression.json").exists():
            skipped.append("compress: no reports/compression.json (run `dvc repro` first)")
            continue
        print(f"== python -m benchmarks.{name} {' '.join(args)}", flush=True)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=ROOT, check=True)
        print(f"== {name}: {time.perf_counter() - start:.0f} s", flush=True)
    return skipped


# ----------------------------------------------------------------------------- report


def machine() -> str:
    """CPU model and its bf16/AMX/VNNI flags, cores, memory, Python and torch versions of this machine."""
    import torch

    from pipeline.modelling.precision import detect_hardware

    model = detect_hardware().describe()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{model}, {len(os.sched_getaffinity(0))} cores available, {mem_gib:.0f} GiB RAM, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def table_of(name: str) -> str:
    """The table part of ``results/<name>.md`` (its title and command line dropped)."""
    text = (RESULTS / f"{name}.md").read_text(encoding="utf-8")
    return text.split("\n\n", 2)[2].strip() if text.count("\n\n") >= 2 else text


def growth(rows: list[dict[str, Any]], size: str, cost: str, unit: str = "MB") -> str:
    """How time grows between the two largest sizes (start-up costs dominate the smallest): 1.0 per unit = linear."""
    mid, last = rows[-2], rows[-1]
    factor, took = last[size] / mid[size], last[cost] / mid[cost]
    ratio = took / factor
    kind = (
        "below linear (start-up costs still amortising)"
        if ratio < 0.9
        else "linear"
        if ratio <= 1.1
        else "ABOVE linear"
    )
    return (
        f"from {mid[size]:g} to {last[size]:g} {unit}, {factor:.1f}x the data took {took:.1f}x the time: {kind}; over the whole range "
        f"{last[size] / rows[0][size]:.0f}x the data took {last[cost] / rows[0][cost]:.1f}x the time"
    )


def headline(results: dict[str, Any]) -> list[str]:  # noqa: C901  # one branch per benchmark's headline row: a table, read top to bottom
    """One row per stage: ours vs the obvious alternative, as ratios."""
    rows = []
    if (r := results.get("ingest")) is not None:
        ours, naive = r["rows"][-2], r["rows"][-1]
        rows.append(
            f"| ingest | pandas `read_json` + `drop_duplicates` ({ours['size_mb']} MB) | {naive['seconds'] / ours['seconds']:.2f}x "
            f"| {naive['peak_rss_mb'] / ours['peak_rss_mb']:.1f}x less ({ours['peak_rss_mb']} vs {naive['peak_rss_mb']} MB) |"
        )
    if (r := results.get("dedup")) is not None:
        near, ours, alt = r["rows"][1], r["rows"][3], r["rows"][-1]  # benchmarks.dedup's METHODS order
        rows.append(
            f"| ingest: near-duplicates + decontamination | datasketch `MinHash` + `MinHashLSH` per document "
            f"(near-duplicates only; documents/s, biomed corpus) | {ours['docs_per_s'] / alt['docs_per_s']:.2f}x "
            f"({near['docs_per_s'] / alt['docs_per_s']:.2f}x for near-duplicates alone; "
            f"{ours['vs_exact']:.3f}x exact-hash dedup's speed) | {alt['peak_rss_mb'] / ours['peak_rss_mb']:.2f}x "
            f"({alt['docs']} vs {ours['docs']} documents held) |"
        )
    if (r := results.get("select")) is not None:
        ours, cached, alt = r["rows"][0], r["rows"][1], r["rows"][-1]  # benchmarks.select's METHODS order
        rows.append(
            f"| select (kNN-TAPT) | embed every block in fp32, one similarity matrix, `topk` ({ours['blocks']} blocks, "
            f"{ours['queries']} train inputs; blocks/s; agreement {ours['agreement']:.3f}) | "
            f"{ours['speed_vs_naive']:.2f}x ({cached['speed_vs_naive']:.1f}x re-run on the cache) | "
            f"{ours['rss_naive_over_this']:.2f}x ({ours['peak_rss_mb']} vs {alt['peak_rss_mb']} MB) |"
        )
    if (r := results.get("tokenize")) is not None:
        ours, bare = r["rows"][-2], r["rows"][-1]
        rows.append(
            f"| tokenize | bare `tokenizer(batch)` ({ours['size_mb']} MB; ours also mines, packs, writes) | "
            f"{bare['seconds'] / ours['seconds']:.2f}x | {bare['peak_rss_mb'] / ours['peak_rss_mb']:.1f}x less "
            f"({ours['peak_rss_mb']} vs {bare['peak_rss_mb']} MB) |"
        )
    if (r := results.get("pretrain")) is not None:
        m = r["rows"]["methods"]
        ours = next(x for x in m if x["method"] == "ours: params.yaml defaults")
        for other in (x for x in m if x["method"].startswith("plain")):
            rows.append(
                f"| pretrain | {other['method']}, fp32 dense head (warm real tokens/s; ours: {ours['precision']}, "
                f"{ours['mlm_head']} head) | {ours['warm_tokens_per_s'] / other['warm_tokens_per_s']:.2f}x | "
                f"{other['peak_rss_mb'] / ours['peak_rss_mb']:.2f}x |"
            )
    if (r := results.get("finetune")) is not None:
        t, s = r["rows"]["train"], r["rows"]["score"]
        for kind, table, unit in (("finetune", t, "examples/s"), ("finetune scoring", s, "examples/s")):
            ours = table[0]
            for other in (
                table[1],
                table[-1],
            ):  # ours in fp32 (the precision ratio), padding to max length (the obvious alternative)
                rows.append(
                    f"| {kind} | {other['method']} ({unit}; ours: {ours['precision']}) | "
                    f"{ours['examples_per_s'] / other['examples_per_s']:.2f}x | {other['peak_rss_mb'] / ours['peak_rss_mb']:.2f}x |"
                )
    if (r := results.get("serve")) is not None:
        ours, single = r["rows"][0], r["rows"][1]
        rows.append(
            f"| serve | {single['method']} (rows/s; single-row latency p50 {single['p50_ms']} ms, p95 {single['p95_ms']} ms) | "
            f"{ours['rows_per_s'] / single['rows_per_s']:.2f}x | {single['peak_rss_mb'] / ours['peak_rss_mb']:.2f}x |"
        )
    if (r := results.get("compress")) is not None:
        full_rss = {x["profile"]: x["peak_rss_mb"] for x in r["rows"] if x["model"] == "full (fp32)"}
        for row in (x for x in r["rows"] if "speedup_p50" in x):
            up = row["speedup_p50"]
            rows.append(
                f"| compress: {row['model']}, {row['profile']} | the full model served in fp32 (bf16) (batch-1 p50; "
                f"{row['delta_points']:+.1f} points of mean primary) | {up['vs_full_fp32']:.2f}x"
                + (f" ({up['vs_full_bf16']:.2f}x)" if "vs_full_bf16" in up else "")
                + f" | {full_rss[row['profile']] / row['peak_rss_mb']:.2f}x ({row['size_mb']:.0f} MB on disk) |"
            )
    return rows


def scaling(results: dict[str, Any]) -> str:
    """3-point tables of how ingest, tokenize and pretrain cost grow with corpus size."""
    parts = []
    if (r := results.get("ingest")) is not None:
        ours = [x for x in r["rows"] if x["method"] == "adaptbert ingest"]
        lines = ["| corpus | documents | seconds | MB/s | peak RSS (MB) |", "|---:|---:|---:|---:|---:|"]
        lines += [
            f"| {x['size_mb']} MB | {x['docs']} | {x['seconds']} | {x['mb_per_s']} | {x['peak_rss_mb']} |" for x in ours
        ]
        parts.append(
            f"**ingest** (`{r['command']}`): {growth(ours, 'size_mb', 'seconds')}; peak memory "
            f"{ours[0]['peak_rss_mb']} -> {ours[-1]['peak_rss_mb']} MB: bounded by `ingest.chunk_docs` (Parquet row groups), "
            f"not by the corpus.\n\n" + "\n".join(lines)
        )
    if (r := results.get("scale")) is not None:
        engines = {
            e: [x for x in r["rows"] if x["engine"] == e and "failed" not in x] for e in ("local", "disk", "ray")
        }
        said = [
            f"{e} {growth(rows, 'size_gb', 'seconds', 'GB')}, largest process {rows[0]['largest_rss_mb']} -> "
            f"{rows[-1]['largest_rss_mb']} MB"
            for e, rows in engines.items()
            if len(rows) > 1
        ]
        sizes = {x["size_gb"] for x in r["rows"]}
        missing = [
            f"{e} at {g:g} GB" for e, rows in engines.items() for g in sorted(sizes - {x["size_gb"] for x in rows})
        ]
        gaps = f"; no measurement for {', '.join(missing)} (failed or not run: the table says which)" if missing else ""
        parts.append(
            f"**ingest at scale, every engine** (`{r['command']}`, {r['machine']}; near-duplicates and "
            f"decontamination on; local: its indexes in RAM, disk: `ingest.index: disk`, ray: the Ray engine): "
            f"{'; '.join(said)}{gaps}. [docs/scale.md](docs/scale.md) reads it.\n\n"
            f"{table_of('scale')}"
        )
    if (r := results.get("scale-tokenize")) is not None:
        engines = {e: [x for x in r["rows"] if x["engine"] == e and "tokens" in x] for e in ("local", "ray")}
        said = [
            f"{e} engine {growth(rows, 'size_gb', 'tokenize_seconds', 'GB')}, largest process "
            f"{rows[0]['tokenize_largest_rss_mb']} -> {rows[-1]['tokenize_largest_rss_mb']} MB"
            for e, rows in engines.items()
            if len(rows) > 1
        ]
        parts.append(
            f"**tokenize at scale, both engines** (`{r['command']}`, {r['machine']}; after that run's ingest, the "
            f"block shards on the same engine): {'; '.join(said)}. [docs/scale.md](docs/scale.md) reads it.\n\n"
            f"{table_of('scale-tokenize')}"
        )
    if (r := results.get("tokenize")) is not None:
        ours = [x for x in r["rows"] if x["method"].startswith("adaptbert")]
        lines = ["| corpus | base tokens | seconds | tokens/s | peak RSS (MB) |", "|---:|---:|---:|---:|---:|"]
        lines += [
            f"| {x['size_mb']} MB | {x['base_tokens']} | {x['seconds']} | {x['tokens_per_s']} | {x['peak_rss_mb']} |"
            for x in ours
        ]
        parts.append(
            f"**tokenize** (`{r['command']}`): {growth(ours, 'size_mb', 'seconds')}; peak memory "
            f"{ours[0]['peak_rss_mb']} -> {ours[-1]['peak_rss_mb']} MB: documents stream in batches of `tokenize.batch_docs` "
            f"and blocks are written as they fill.\n\n" + "\n".join(lines)
        )
    if (r := results.get("pretrain")) is not None and r["rows"]["scaling"]:
        rows = r["rows"]["scaling"]
        lines = ["| corpus | train blocks | steps | real tokens/s | peak RSS (MB) |", "|---:|---:|---:|---:|---:|"]
        lines += [
            f"| {x['size_mb']} MB | {x['train_blocks']} | {x['steps']} | {x['real_tokens_per_s']} | {x['peak_rss_mb']} |"
            for x in rows
        ]
        parts.append(
            f"**pretrain** (`{r['command']}`): tokens/s {rows[0]['real_tokens_per_s']} -> {rows[-1]['real_tokens_per_s']} "
            f"and peak memory {rows[0]['peak_rss_mb']} -> {rows[-1]['peak_rss_mb']} MB over {rows[-1]['size_mb'] // rows[0]['size_mb']}x "
            "the corpus: throughput does not depend on corpus size, so cost is linear in the tokens trained on "
            "(`max_steps` x global batch x block length); the blocks are memory-mapped Arrow, so RAM does not grow "
            "with the corpus.\n\n" + "\n".join(lines)
        )
    return "\n\n".join(parts)


def gpu_section(results: dict[str, Any]) -> str:
    r = results.get("gpu")
    if r is None:
        return (
            "No GPU figures yet: no GPU was available where this report was generated. On a GPU machine, "
            "`python -m benchmarks.gpu_check` (under 5 minutes) writes `benchmarks/results/gpu.{md,json}`; "
            "then `python -m benchmarks report`."
        )
    return f"**GPU numbers**, measured {r['date']} on {r['device']} (`{r['command']}`):\n\n{table_of('gpu')}"


def write_report(skipped: list[str] | None = None) -> str:
    """``BENCHMARKS.md`` from whatever ``benchmarks/results/*.json`` hold."""
    names = (
        "ingest",
        "scale",
        "scale-tokenize",
        "dedup",
        "decontamination",
        "select",
        "tokenize",
        "pretrain",
        "electra",
        "head_warmup",
        "batch_size",
        "finetune",
        "serve",
        "compress",
        "recipes",
        "team_stack",
        "gpu",
    )
    results = {n: r for n in names if (r := load(n)) is not None}
    dates = sorted({r["date"] for r in results.values()})
    sections = []
    for name in names[:-1]:
        if name in results:
            measured = f"{results[name]['date']}, {results[name].get('machine', 'machine not recorded')}"
            sections.append(f"### {name}\n\n`{results[name]['command']}` ({measured})\n\n{table_of(name)}")
        else:
            sections.append(
                f"### {name}\n\nnot measured"
                + (f" ({next((s for s in skipped or [] if s.startswith(name)), '')})" if skipped else "")
            )
    text = f"""# Benchmarks

Generated by `python -m benchmarks all` (then `python -m benchmarks report`) on {time.strftime("%Y-%m-%d")}.
Written on: {machine()}. Measurements dated {", ".join(dates) or "none"}, each section naming its date and
machine. Every figure compares our stage with the
obvious alternative on the same machine, in the same run, each in a fresh process (peak RSS = that process's
`ru_maxrss`). Ratios > 1 favour adaptbert.

## Ours vs the obvious alternative

| stage | alternative (at the largest size) | speed ratio (ours / alternative) | peak memory (alternative / ours) |
|---|---|---:|---:|
{chr(10).join(headline(results))}

## How cost grows with corpus size

{scaling(results)}

## GPU

{gpu_section(results)}

## Every table

{(chr(10) * 2).join(sections)}
"""
    REPORT.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["all", "report"])
    args = parser.parse_args(argv)
    skipped = run_all() if args.command == "all" else []
    write_report(skipped)
    print(f"wrote {REPORT.relative_to(ROOT)}" + "".join(f"\nskipped {s}" for s in skipped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
