"""compress stage: smaller, faster variants of the fine-tuned model, each measured like the model it replaces.

From ``models/finetuned/`` (every task head) it builds the variants ``compress.variants`` asks for
(int8, distilled, pruned, distilled_int8: each one entry of :mod:`pipeline.compression.recipes`).

Each variant is scored on the test splits with a paired bootstrap CI against the full model, and
timed through the serving code in a fresh process (:mod:`pipeline.serving.speed`). A variant
below ``compress.accuracy_floor`` is reported and marked not servable (register skips it).
Writes ``models/compressed/<variant>/``, ``reports/compression.json`` (DVC metrics),
``reports/compression.md`` and ``reports/compression/front.png``; all or nothing.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.compression.recipes import BuildJob, build_variants, is_quantised, variant_card
from pipeline.core.config import Config
from pipeline.core.io import require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.reporting.attention import plot_head_importance


def floor_check(entry: dict[str, Any], full_mean: float, cfg: Config) -> tuple[bool, str]:
    """Whether a variant is servable under ``compress.accuracy_floor``, and why (pure)."""
    floor = cfg.compress.accuracy_floor
    drop = full_mean - entry["mean_primary"]
    worst = max(entry["tasks"].items(), key=lambda kv: -kv[1]["delta"])
    problems = []
    if drop > floor.max_mean_drop + 1e-12:
        problems.append(f"mean primary drops {drop:.4f} > max_mean_drop {floor.max_mean_drop}")
    if -worst[1]["delta"] > floor.max_task_drop + 1e-12:
        problems.append(f"{worst[0]} drops {-worst[1]['delta']:.4f} > max_task_drop {floor.max_task_drop}")
    return not problems, "; ".join(problems) or "within compress.accuracy_floor"


def measure_all(
    cfg: Config, paths: Paths, dirs: dict[str, Path], precision: Precision, hw_bf16: bool
) -> dict[str, dict[str, Any]]:
    """Serving speed and memory of every model directory, each in its own process."""
    from pipeline.serving.service import requests_from_tasks
    from pipeline.serving.speed import speed_in_subprocess

    lc = cfg.compress.latency
    per_task = max(1, lc.requests // max(1, len(list(paths.tasks.glob("*/task.json")))))
    with tempfile.TemporaryDirectory() as tmp:
        requests = Path(tmp) / "requests.parquet"
        requests_from_tasks(paths.tasks, per_task).to_parquet(requests)
        speeds = {}
        for name, model_dir in dirs.items():
            precisions = ["fp32"] if is_quantised(name) else ["fp32", *(["bf16"] if hw_bf16 else [])]
            speeds[name] = speed_in_subprocess(
                model_dir, requests, precisions, lc, cfg.tokenize.max_seq_length, cfg.tokenize.doc_stride
            )
    return speeds


def against_full(
    name: str, entry: dict[str, Any], full: dict[str, Any], speeds: dict[str, Any], precision: Precision, cfg: Config
) -> dict[str, Any]:
    """A variant's speed, size and floor verdict next to the full model's."""
    key = serving_key(name, precision)
    verdict = floor_check(entry, full["mean_primary"], cfg)
    return {
        "speed": speeds[name],
        "served_in": key,
        "size_ratio": round(full["size_mb"] / entry["size_mb"], 2),
        # against the full model in the same precision (INT8, which has one, against the full model in each)
        "speedup_p50": {
            f"vs_full_{p}": round(speeds["full"][p]["p50_ms"] / speeds[name].get(p, speeds[name][key])["p50_ms"], 2)
            for p in ("fp32", "bf16")
            if p in speeds["full"]
        },
        "servable": verdict[0],
        "floor": verdict[1],
    }


def serving_key(name: str, precision: Precision) -> str:
    """Which measured precision a model is served in: int8 variants fp32 activations, the others ``precision``."""
    return "fp32" if is_quantised(name) else precision.name


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Build, score and time every variant; write ``models/compressed/`` and the compression reports."""
    import matplotlib

    matplotlib.use("Agg")
    from pipeline.compression.measure import dir_megabytes, score_against
    from pipeline.compression.quantize import machine_backend
    from pipeline.compression.variants import save_variant
    from pipeline.modelling.precision import cpu_model_and_flags
    from pipeline.training.data import load_contender
    from pipeline.training.multitask import mean_primary, score_task

    start = time.perf_counter()
    cc, ec = cfg.compress, cfg.evaluate
    precision = resolve_precision(cfg.precision)
    paths.compress_checkpoints.mkdir(parents=True, exist_ok=True)  # a DVC output, even when nothing trains
    if not cc.enabled:
        report = {"enabled": False, "variants": {}}
        with transaction(paths.root, "compress") as txn:
            (txn.dir(paths.compressed) / "README.md").write_text("compress.enabled is false: no variants.\n")
            txn.dir(paths.compression_plots)
            txn.write_text(paths.compression_markdown, "# Compression\n\n`compress.enabled` is false.\n")
            txn.write_report(paths.compression_report, report)
        return report
    require_inputs({paths.finetuned: "finetune", paths.tokenized / "tasks": "tokenize", paths.tasks: "ingest"})
    backend = machine_backend(cc.int8.backend) if any(is_quantised(v) for v in cc.variants) else None
    teacher, tok, tasks = load_contender(paths.finetuned, cfg, paths, paths.tokenized / "tasks")
    pad = tok.pad_token_id
    full_scored = {n: score_task(teacher, d, "test", pad, ec.batch_size, precision) for n, d in tasks.items()}
    full_primary = {n: s.primary(tasks[n].spec) for n, s in full_scored.items()}
    with transaction(paths.root, "compress") as txn:
        plots = txn.dir(paths.compression_plots)  # the learning curves of the trained variants land here first
        built = build_variants(BuildJob(cfg, paths, plots, teacher, tok, tasks, precision, backend), cc.variants)
        out = txn.dir(paths.compressed)
        tasks_json = (paths.finetuned / "tasks.json").read_text(encoding="utf-8")
        variants: dict[str, Any] = {}
        for name, (model, meta, summary) in built.items():
            save_variant(model, tok, out / name, meta, variant_card(name, summary, tasks), tasks_json)
            scored = score_against(
                model,
                tasks,
                full_scored,
                pad,
                ec.batch_size,
                precision,
                ec.bootstrap_resamples,
                cfg.seed,
                ec.confidence,
            )
            mean = mean_primary({t: s["value"] for t, s in scored.items()})
            variants[name] = {
                "tasks": scored,
                "mean_primary": mean,
                "mean_primary_delta": mean - mean_primary(full_primary),
                "size_mb": dir_megabytes(out / name),
                "build": {k: v for k, v in summary.items() if k not in ("importance", "checkpoint_log")},
            }
        hw_bf16 = resolve_precision("auto").bf16
        speeds = measure_all(cfg, paths, {"full": paths.finetuned} | {n: out / n for n in built}, precision, hw_bf16)
        full = {
            "mean_primary": mean_primary(full_primary),
            "tasks": {n: {"primary": tasks[n].spec.primary, "value": v} for n, v in full_primary.items()},
            "size_mb": dir_megabytes(paths.finetuned),
            "speed": speeds["full"],
            "served_in": serving_key("full", precision),
        }
        for name, entry in variants.items():
            entry |= against_full(name, entry, full, speeds, precision, cfg)
        cpu, flags = cpu_model_and_flags()
        report = {
            "enabled": True,
            "machine": {
                "cpu": cpu,
                "flags": sorted(flags & {"amx_bf16", "avx512_bf16", "amx_int8", "avx512_vnni", "avx_vnni"}),
                "threads": speeds["full"]["threads"],
            },
            "serving_precision": precision.name,
            "int8_backend": {"engine": backend.engine, "reason": backend.reason, "fallbacks": list(backend.fallbacks)}
            if backend
            else None,
            "bootstrap": {"resamples": ec.bootstrap_resamples, "confidence": ec.confidence},
            "full": full,
            "variants": variants,
        }
        report = _rounded(report)
        plot_front(report, plots / "front.png")
        for _, _, built_summary in built.values():  # what a pruned variant was cut from, for the run report
            if "importance" in built_summary:
                plot_head_importance(built_summary["importance"], built_summary["heads"], plots / "head_importance.png")
        report["seconds"] = round(time.perf_counter() - start, 1)
        txn.write_text(paths.compression_markdown, compression_markdown(report))
        txn.write_report(paths.compression_report, report)
    return report


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def front_points(report: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(label, batch-1 p50 ms, mean primary) of the full model in each precision and of every variant as served."""
    full = report["full"]
    points = [
        (f"full ({p})", full["speed"][p]["p50_ms"], full["mean_primary"])
        for p in ("fp32", "bf16")
        if p in full["speed"]
    ]
    for name, v in report["variants"].items():
        points.append((name, v["speed"][v["served_in"]]["p50_ms"], v["mean_primary"]))
    return points


def plot_front(report: dict[str, Any], path: Path) -> None:
    """Mean primary test metric against batch-1 p50 latency: every model on one plot."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, ms, mean in front_points(report):
        servable = report["variants"].get(label, {}).get("servable", True)
        ax.scatter([ms], [100 * mean], s=60, marker="o" if servable else "x", color="C0" if "full" in label else "C1")
        ax.annotate(label, (ms, 100 * mean), textcoords="offset points", xytext=(6, 4), fontsize=9)
    ax.margins(x=0.12, y=0.1)  # room for the labels at the edges
    ax.set(
        title="accuracy vs latency (test, batch 1, serving code path)",
        xlabel="batch-1 p50 latency (ms)",
        ylabel="mean primary metric (%)",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def compression_markdown(r: dict[str, Any]) -> str:
    """The front table, per-task deltas with CIs, and how each variant was built."""
    full, conf = r["full"], r["bootstrap"]["confidence"]
    m = r["machine"]
    tasks = list(full["tasks"])
    lines = [
        "# Compression: what each variant costs and keeps",
        "",
        f"Machine: {m['cpu']} ({', '.join(m['flags']) or 'no bf16/int8 extensions'}), {m['threads']} threads. "
        f"Latency and throughput through the serving code (`Predictor`), one fresh process per model; "
        f"non-INT8 models in `precision: {r['serving_precision']}` as served, INT8 with fp32 activations"
        + (f" ({r['int8_backend']['engine']}: {r['int8_backend']['reason']})." if r["int8_backend"] else "."),
        "",
        "Speedup: the full model's batch-1 p50 over the variant's, both in fp32 / both in bf16 (INT8 runs its int8 "
        "kernels on fp32 activations: against the full model in each). p50 / p95 and rows/s: as served.",
        "",
        "| model | size MB | peak RSS MB | batch-1 p50 / p95 ms | speedup vs full fp32 / bf16 | batch rows/s | mean primary | delta | servable |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in ("fp32", "bf16"):
        if p in full["speed"]:
            s = full["speed"][p]
            lines.append(
                f"| full ({p}) | {full['size_mb']:.1f} | {full['speed']['peak_rss_mb']:.0f} | {s['p50_ms']:.2f} / {s['p95_ms']:.2f} | "
                f"- | {s['throughput_rows_per_s']:.0f} | {100 * full['mean_primary']:.1f} | | |"
            )
    for name, v in r["variants"].items():
        s = v["speed"][v["served_in"]]
        up = " / ".join(f"{x:.2f}x" for x in v["speedup_p50"].values())
        lines.append(
            f"| {name} ({v['served_in']}) | {v['size_mb']:.1f} | {v['speed']['peak_rss_mb']:.0f} | {s['p50_ms']:.2f} / {s['p95_ms']:.2f} | "
            f"{up} | {s['throughput_rows_per_s']:.0f} | {100 * v['mean_primary']:.1f} | {100 * v['mean_primary_delta']:+.1f} | "
            f"{'yes' if v['servable'] else 'no: ' + v['floor']} |"
        )
    lines += [
        "",
        f"## Per task: primary test metric and the paired bootstrap {conf:.0%} CI of (variant - full)",
        "",
        "| variant | " + " | ".join(f"{t} ({full['tasks'][t]['primary']})" for t in tasks) + " |",
        "|---|" + "---|" * len(tasks),
        "| full | " + " | ".join(f"{100 * full['tasks'][t]['value']:.1f}" for t in tasks) + " |",
    ]
    for name, v in r["variants"].items():
        cells = [
            f"{100 * v['tasks'][t]['value']:.1f} ({100 * v['tasks'][t]['delta']:+.1f} [{100 * v['tasks'][t]['ci_low']:+.1f}, "
            f"{100 * v['tasks'][t]['ci_high']:+.1f}])"
            for t in tasks
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Share of test predictions identical to the full model's (label, tag sequence, answer span, label set):",
        "",
        "| variant | " + " | ".join(tasks) + " |",
        "|---|" + "---|" * len(tasks),
    ]
    for name, v in r["variants"].items():
        same = [v["tasks"][t].get("agreement") for t in tasks]
        lines.append(f"| {name} | " + " | ".join("-" if a is None else f"{100 * a:.1f}%" for a in same) + " |")
    lines += ["", "## How each variant was built", ""]
    for name, v in r["variants"].items():
        b = v["build"]
        how = [f"{b['build_seconds']} s"]
        if b.get("teacher_layers") is not None:
            how.append(f"student layers {b['teacher_layers']}")
        if b.get("heads") is not None:
            kept = sum(len(h) for h in b["heads"].values())
            how.append(f"{kept} heads kept per layer " + ", ".join(str(len(h)) for h in b["heads"].values()))
        if "steps" in b:
            how.append(
                f"{b['steps']} steps, best dev mean primary {b['best_dev_mean_primary']} at step {b['best_step']}"
            )
        lines.append(f"- **{name}**: " + "; ".join(how))
    lines += ["", "![accuracy vs latency](compression/front.png)"]
    return "\n".join(lines) + "\n"


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline compress``."""
    if not r["enabled"]:
        return "compress.enabled is false: no variants built"
    full = r["full"]
    key = full["served_in"]
    lines = [f"full: {full['speed'][key]['p50_ms']:.2f} ms batch-1 ({key}), mean primary {full['mean_primary']:.3f}"]
    if r["int8_backend"] and r["int8_backend"]["fallbacks"]:
        lines += [f"int8: {note}" for note in r["int8_backend"]["fallbacks"]] + [f"int8: {r['int8_backend']['reason']}"]
    for name, v in r["variants"].items():
        s = v["speed"][v["served_in"]]
        lines.append(
            f"{name}: {s['p50_ms']:.2f} ms ({v['speedup_p50'].get(f'vs_full_{key}', 0):.2f}x), {v['size_mb']:.0f} MB, "
            f"mean primary {v['mean_primary']:.3f} ({100 * v['mean_primary_delta']:+.1f} points)"
            + ("" if v["servable"] else f", not servable: {v['floor']}")
        )
    return "\n".join(lines) + f"\nreport: {paths.compression_markdown}"
