"""Benchmark: the compressed variants against the full model, and against the issue's targets.

    dvc repro                                                  # reports/compression.json of the demo
    python -m benchmarks.compress                              # the demo's front -> results/compress.{md,json}
    python -m benchmarks.compress --report biomed=PATH/reports/compression.json   # add another profile's run

The compress stage does the measuring (each model timed through the serving ``Predictor`` in a
fresh process, batch-1 p50/p95 and batch throughput, peak RSS, size on disk, the test metrics with
a paired bootstrap CI against the full model: :mod:`pipeline.compression.measure`); this collects
its reports, names the machine they ran on and checks each variant against its target:

- int8: batch-1 p50 >= 2x faster than the full model in fp32 (>= 1.3x than in bf16 where the CPU
  has it), mean primary metric within 1 point;
- distilled (half the layers): >= 1.8x faster, within 3 points;
- pruned (>= 30% of the heads removed): >= 1.25x faster, within 1.5 points
  (distilled and pruned: each model in its faster precision, best against best).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, save_results
from pipeline.core.io import read_report
from pipeline.core.reports.compression import CompressionReport, FullEntry, VariantEntry
from pipeline.reporting.tables import front_view, to_records

TARGETS = {  # variant -> (speedup vs full fp32, speedup vs full bf16 or None, largest mean drop in points)
    "int8": (2.0, 1.3, 1.0),
    "distilled": (1.8, None, 3.0),
    "pruned": (1.25, None, 1.5),
}


def verdict(name: str, v: VariantEntry, full: FullEntry) -> str:
    """Whether a variant meets its target, with the numbers that decide it.

    INT8 against the full model in fp32 and in bf16, as the target is stated; distilled and pruned
    best against best (each in its faster precision: the bar a user who tunes `precision` faces).
    """
    if name not in TARGETS:
        return "-"
    fp32_x, bf16_x, points = TARGETS[name]
    up = v.speedup_p50 or {}
    drop = -100 * v.mean_primary_delta
    if name == "int8":
        checks = [(f"{up['vs_full_fp32']:.2f}x vs fp32 (>= {fp32_x})", up["vs_full_fp32"] >= fp32_x)]
        if bf16_x is not None and "vs_full_bf16" in up:
            checks.append((f"{up['vs_full_bf16']:.2f}x vs bf16 (>= {bf16_x})", up["vs_full_bf16"] >= bf16_x))
    else:
        if full.speed is None or v.speed is None:
            return "not timed (reports/measured/compression.json is missing)"
        best = full.speed.fastest_p50_ms() / v.speed.fastest_p50_ms()
        checks = [(f"{best:.2f}x best vs best (>= {fp32_x})", best >= fp32_x)]
    checks.append((f"-{drop:.1f} points (<= {points})" if drop > 0 else f"+{-drop:.1f} points", drop <= points))
    met = all(ok for _, ok in checks)
    return ("met: " if met else "MISSED: ") + ", ".join(text for text, _ in checks)


def rows_of(label: str, report: CompressionReport) -> list[dict[str, Any]]:
    """The compress stage's front (its one view, :func:`pipeline.reporting.tables.front_view`) with this
    benchmark's columns: the profile, the delta in points and each variant's target."""
    variants, full = list(report.variants.items()), report.full
    assert full is not None  # callers pass enabled reports only
    rows = to_records(front_view(report))
    n_full = len(rows) - len(variants)  # the full model's rows (one per measured precision) come first
    for row in rows:
        row |= {"profile": label, "delta_points": round(100 * row.pop("delta"), 2), "target": "-"}
    for row, (name, v) in zip(rows[n_full:], variants, strict=True):
        row |= {"target": verdict(name, v, full), "speedup_p50": v.speedup_p50}
    return rows


def markdown(rows: list[dict[str, Any]], machines: dict[str, str]) -> str:
    lines = [
        "| profile | model | size MB | peak RSS MB | batch-1 p50 / p95 ms | batch rows/s | mean primary | delta (points) | target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['profile']} | {r['model']} | {r['size_mb']:.1f} | {r['peak_rss_mb']:.0f} | {r['p50_ms']:.2f} / {r['p95_ms']:.2f} | "
            f"{r['rows_per_s']:.0f} | {100 * r['mean_primary']:.1f} | {r['delta_points']:+.1f} | {r['target']} |"
        )
    where = "; ".join(f"{label}: {m}" for label, m in machines.items())
    return "\n".join(lines) + f"\n\nMeasured by the compress stage on {where}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compress", description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="append", default=[], help="LABEL=PATH of another compression.json")
    args = parser.parse_args(argv)
    reports = {"demo": ROOT / "reports" / "compression.json"} | {
        label: Path(path) for label, path in (r.split("=", 1) for r in args.report)
    }
    rows, machines = [], {}
    for label, path in reports.items():
        report = read_report(path, CompressionReport)
        if not report.enabled or report.machine is None:
            raise SystemExit(f"{path}: compress.enabled was false, nothing to report")
        m = report.machine
        machines[label] = f"{m.cpu} ({', '.join(m.flags)}), {m.threads} threads"
        rows += rows_of(label, report)
    note = (
        "Each model timed through the serving `Predictor` in a fresh process by the compress stage; the target column "
        "checks the issue's targets."
    )
    save_results("compress", " ".join(f"--report {r}" for r in args.report), note, markdown(rows, machines), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
