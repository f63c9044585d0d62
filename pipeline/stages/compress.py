"""compress stage: smaller, faster variants of the fine-tuned model, each measured like the model it replaces.

From ``models/finetuned/`` (every task head) it builds the variants ``compress.variants`` asks for
(int8, distilled, pruned, distilled_int8: each one entry of :mod:`pipeline.compression.recipes`).

Each variant is scored on the test splits with a paired bootstrap CI against the full model, and
timed through the serving code in a process of its own (:mod:`pipeline.serving.speed`). A variant
below ``compress.accuracy_floor`` is reported and marked not servable (register skips it).
Writes ``models/compressed/<variant>/``, ``reports/compression.json`` (DVC metrics),
``reports/compression.md`` and ``reports/compression/front.png``; all or nothing.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.compression.measure import against_full, dir_megabytes, score_against
from pipeline.compression.recipes import VARIANTS, BuildJob, build_variants, is_quantised
from pipeline.core.config import Config
from pipeline.core.io import require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.compression import CompressionReport
from pipeline.modelling.precision import Precision, resolve_precision
from pipeline.reporting.attention import plot_head_importance
from pipeline.reporting.compression import compression_markdown, noisy_timings, plot_front
from pipeline.reporting.model_readmes import variant_card
from pipeline.reporting.numbers import points

INT8_FLAGS = {"amx_bf16", "avx512_bf16", "amx_int8", "avx512_vnni", "avx_vnni"}  # the CPU flags the report names


def measure_all(
    cfg: Config, paths: Paths, dirs: dict[str, Path], precision: Precision, hw_bf16: bool
) -> dict[str, dict[str, Any]]:
    """Serving speed and memory of every model directory, each in its own process."""
    from pipeline.serving.service import requests_from_tasks
    from pipeline.serving.speed import speeds_in_worker

    lc = cfg.compress.latency
    per_task = max(1, lc.requests // max(1, len(list(paths.tasks.glob("*/task.json")))))
    with tempfile.TemporaryDirectory() as tmp:
        requests = Path(tmp) / "requests.parquet"
        requests_from_tasks(paths.tasks, per_task).to_parquet(requests)
        jobs = {
            name: (model_dir, ["fp32"] if is_quantised(name) else ["fp32", *(["bf16"] if hw_bf16 else [])])
            for name, model_dir in dirs.items()
        }
        return speeds_in_worker(jobs, requests, lc, cfg.tokenize.max_seq_length, cfg.tokenize.doc_stride)


def serving_key(name: str, precision: Precision) -> str:
    """Which measured precision a model is served in: int8 variants fp32 activations, the others ``precision``."""
    return "fp32" if is_quantised(name) else precision.name


def run(cfg: Config, paths: Paths) -> CompressionReport:
    """Build, score and time every variant; write ``models/compressed/`` and the compression reports."""
    from pipeline.reporting.figures import use_headless

    use_headless()
    from pipeline.compression.quantize import machine_backend
    from pipeline.training.data import load_contender
    from pipeline.training.multitask import score_task

    start = time.perf_counter()
    cc, ec = cfg.compress, cfg.evaluate
    precision = resolve_precision(cfg.precision)
    paths.compress_checkpoints.mkdir(parents=True, exist_ok=True)  # a DVC output, even when nothing trains
    if not cc.enabled:
        return write_disabled(paths)
    require_inputs(paths.finetuned, paths.task_features, paths.tasks)
    backend = machine_backend(cc.int8.backend) if any(is_quantised(v) for v in cc.variants) else None
    teacher, tok, tasks = load_contender(paths.finetuned, cfg, paths, paths.task_features)
    full_scored = {
        n: score_task(teacher, d, "test", tok.pad_token_id, ec.batch_size, precision) for n, d in tasks.items()
    }
    with transaction(paths.root, "compress") as txn:
        plots = txn.dir(paths.compression_plots)  # the learning curves of the trained variants land here first
        built = build_variants(BuildJob(cfg, paths, plots, teacher, tok, tasks, precision, backend), cc.variants)
        out = txn.dir(paths.compressed)
        variants = save_and_score(cfg, paths, built, out, tok, tasks, full_scored, precision)
        speeds = measure_all(
            cfg,
            paths,
            {"full": paths.finetuned} | {n: out / n for n in built},
            precision,
            resolve_precision("auto").bf16,
        )
        full = full_entry(paths, tasks, full_scored, speeds, precision)
        for name, entry in variants.items():
            entry |= against_full(name, entry, full, speeds, serving_key(name, precision), cfg)
        scored = compression_report(cfg, full, variants, precision, backend)
        plot_front(scored, plots / "front.png")
        for _, _, built_summary in built.values():  # what a pruned variant was cut from, for the run report
            if "importance" in built_summary:
                plot_head_importance(built_summary["importance"], built_summary["heads"], plots / "head_importance.png")
        report = scored.model_copy(update={"seconds": round(time.perf_counter() - start, 1)})
        txn.write_text(paths.compression_markdown, compression_markdown(report))
        txn.write_report(paths.compression_report, report)
    return report


def write_disabled(paths: Paths) -> CompressionReport:
    """``compress.enabled: false``: every output still exists (DVC outs), saying so."""
    report = CompressionReport(enabled=False, variants={})
    with transaction(paths.root, "compress") as txn:
        (txn.dir(paths.compressed) / "README.md").write_text("compress.enabled is false: no variants.\n")
        txn.dir(paths.compression_plots)
        txn.write_text(paths.compression_markdown, compression_markdown(report))
        txn.write_report(paths.compression_report, report)
    return report


def save_and_score(
    cfg: Config,
    paths: Paths,
    built: dict[str, Any],
    out: Path,
    tok: Any,
    tasks: dict[str, Any],
    full_scored: dict[str, Any],
    precision: Precision,
) -> dict[str, Any]:
    """Write each built variant's directory and score it on test against the full model."""
    from pipeline.compression.variants import save_variant
    from pipeline.training.multitask import mean_primary

    ec = cfg.evaluate
    full_mean = mean_primary({n: s.primary(tasks[n].spec) for n, s in full_scored.items()})
    tasks_json = (paths.finetuned / "tasks.json").read_text(encoding="utf-8")
    variants: dict[str, Any] = {}
    for name, (model, meta, summary) in built.items():
        save_variant(model, tok, out / name, meta, variant_card(name, VARIANTS[name].card(summary), tasks), tasks_json)
        scored = score_against(
            model,
            tasks,
            full_scored,
            tok.pad_token_id,
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
            "mean_primary_delta": mean - full_mean,
            "size_mb": dir_megabytes(out / name),
            "build": {k: v for k, v in summary.items() if k not in ("importance", "checkpoint_log")},
        }
    return variants


def full_entry(
    paths: Paths, tasks: dict[str, Any], full_scored: dict[str, Any], speeds: dict[str, Any], precision: Precision
) -> dict[str, Any]:
    """The full model's row of the report: its test metrics, size and speed."""
    from pipeline.training.multitask import mean_primary

    full_primary = {n: s.primary(tasks[n].spec) for n, s in full_scored.items()}
    return {
        "mean_primary": mean_primary(full_primary),
        "tasks": {n: {"primary": tasks[n].spec.primary, "value": v} for n, v in full_primary.items()},
        "size_mb": dir_megabytes(paths.finetuned),
        "speed": speeds["full"],
        "served_in": serving_key("full", precision),
    }


def compression_report(
    cfg: Config,
    full: dict[str, Any],
    variants: dict[str, Any],
    precision: Precision,
    backend: Any,
) -> CompressionReport:
    """reports/compression.json: the machine, the INT8 engine, the full model and every variant (floats to 5
    decimals); the entries as :mod:`pipeline.compression.measure` and the serving timer wrote them, checked by the
    type (an unknown or missing key is an error here, where it is written)."""
    from pipeline.modelling.precision import cpu_model_and_flags

    cpu, flags = cpu_model_and_flags()
    ec = cfg.evaluate
    report = {
        "enabled": True,
        "machine": {"cpu": cpu, "flags": sorted(flags & INT8_FLAGS), "threads": full["speed"]["threads"]},
        "serving_precision": precision.name,
        "int8_backend": {"engine": backend.engine, "reason": backend.reason, "fallbacks": list(backend.fallbacks)}
        if backend
        else None,
        "bootstrap": {"resamples": ec.bootstrap_resamples, "confidence": ec.confidence},
        "full": full,
        "variants": variants,
    }
    return CompressionReport.model_validate(_rounded(report))


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def summary(r: CompressionReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline compress``."""
    if not r.enabled or r.full is None:
        return "compress.enabled is false: no variants built"
    full = r.full
    timed = ", ".join(f"{s.p50_ms:.2f} ms ({p})" for p, s in (full.speed.precisions() if full.speed else {}).items())
    lines = [f"full: {timed} batch-1, served in {full.served_in}; mean primary {points(full.mean_primary)}"]
    if r.int8_backend and r.int8_backend.fallbacks:
        lines += [f"int8: {note}" for note in r.int8_backend.fallbacks] + [f"int8: {r.int8_backend.reason}"]
    for name, v in r.variants.items():
        s = v.served_speed()
        timing = "not timed" if s is None else f"{s.p50_ms:.2f} ms ({v.speedup_vs_fastest_full:.2f}x the fastest full)"
        lines.append(
            f"{name}: {timing}, {v.size_mb:.0f} MB, "
            f"mean primary {points(v.mean_primary)} ({points(v.mean_primary_delta, signed=True)} points)"
            + ("" if v.servable else f", not servable: {v.floor}")
        )
    if noisy := noisy_timings(r):
        lines.append("timings measured on a busy machine, compare with care: " + "; ".join(noisy))
    return "\n".join(lines) + f"\nreport: {paths.compression_markdown}"
