"""The compress stage on the tiny fine-tuned project: every variant built, scored, timed, loadable; bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.compression import measure
from pipeline.core.errors import DataError, MissingInput
from pipeline.core.io import check_json_seal, read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.compression import CompressionReport
from pipeline.stages import compress
from tests.conftest import ROOT, TINY_COMPRESS, TINY_FINETUNE, TINY_PRETRAIN, copy_project, make_config, write_params


def config(**overrides):
    return make_config(**TINY_PRETRAIN, **TINY_FINETUNE, **TINY_COMPRESS, **overrides)


@pytest.fixture(scope="module")
def compressed(finetuned, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    _, src, _, metrics = finetuned
    paths = copy_project(src, tmp_path_factory.mktemp("compressed"))
    cfg = config()
    return cfg, paths, compress.run(cfg, paths), metrics


def test_every_variant_is_written_scored_and_timed(compressed) -> None:
    from pipeline.compression.variants import load_model

    _, paths, report, metrics = compressed
    assert list(report.variants) == ["int8", "distilled", "pruned", "distilled_int8"]
    full = report.full
    assert full is not None
    for task, t in full.tasks.items():  # the full model scores what evaluate scored
        assert t.value == pytest.approx(metrics.tasks[task].adapted[t.primary], abs=1e-4)
    for name, v in report.variants.items():
        model, _ = load_model(paths.compressed / name)
        assert set(model.specs) == set(full.tasks)  # every head kept
        for task, t in v.tasks.items():
            assert t.ci_low <= t.delta <= t.ci_high
            assert t.delta == pytest.approx(t.value - full.tasks[task].value, abs=1e-4)
        speed = v.served_speed()
        assert speed is not None and v.speed is not None
        assert 0 < speed.p50_ms <= speed.p95_ms and speed.throughput_rows_per_s > 0
        assert len(speed.p50_rounds_ms) == 4 and min(speed.p50_rounds_ms) <= speed.p95_ms  # 8 requests
        assert speed.cores and speed.cores >= 1 and speed.load_1m is not None and speed.load_1m >= 0
        assert v.speed.peak_rss_mb > v.speed.rss_before_load_mb > 0
        assert v.size_mb > 0 and (paths.compressed / name / "README.md").exists()
    assert report.variants["int8"].served_in == "fp32"  # int8 kernels take fp32 activations
    assert report.variants["int8"].size_mb < full.size_mb
    assert report.variants["distilled"].build.teacher_layers == [0]  # every other of the tiny 2 layers
    heads = report.variants["pruned"].build.heads
    assert heads is not None and sum(len(h) for h in heads.values()) == 2  # 4 heads, half go
    md = paths.compression_markdown.read_text()
    assert "| int8 (fp32) |" in md and "paired bootstrap" in md and "p50 of rounds ms" in md
    assert (paths.compression_plots / "front.png").stat().st_size > 5000
    assert (paths.compression_plots / "head_importance.png").stat().st_size > 3000  # what pruning cut, drawn
    assert read_report(paths.compression_report, CompressionReport) == report  # written and read through the type
    stable = json.loads(paths.compression_report.read_text())
    assert "speed" not in stable["full"] and "seconds" not in stable  # the timings are the measured half


def test_the_accuracy_floor_decides_what_is_servable(compressed) -> None:
    cfg, _, report, _ = compressed
    floor = cfg.compress.accuracy_floor
    full = report.full.mean_primary
    for v in report.variants.values():
        worst = max(-t.delta for t in v.tasks.values())
        within = full - v.mean_primary <= floor.max_mean_drop + 1e-9 and worst <= floor.max_task_drop + 1e-9
        assert v.servable == within, v.floor
    strict = config(**{"compress.accuracy_floor.max_mean_drop": 0.0, "compress.accuracy_floor.max_task_drop": 0.0})
    entry = {"mean_primary": full - 0.01, "tasks": {"a": {"delta": -0.01}}}
    ok, why = measure.floor_check(entry, full, strict)
    assert not ok and "max_mean_drop 0.0" in why and "a drops 0.0100" in why
    assert measure.floor_check({"mean_primary": full, "tasks": {"a": {"delta": 0.0}}}, full, strict)[0]


def test_a_missing_or_corrupt_finetuned_model_names_the_file_and_the_stage(finetuned, tmp_path: Path) -> None:
    _, src, _, _ = finetuned
    paths = copy_project(src, tmp_path / "p")
    cfg = config(**{"compress.variants": ["int8"]})
    heads = paths.finetuned / "heads.safetensors"
    heads.write_bytes(b"not a safetensors file")
    with pytest.raises(DataError, match=r"corrupt-model.*re-run finetune"):
        compress.run(cfg, paths)
    assert not paths.compressed.exists() and not paths.compression_report.exists()  # nothing half-written
    import shutil

    shutil.rmtree(paths.finetuned)
    with pytest.raises(MissingInput, match="finetune"):
        compress.run(cfg, paths)


def test_disabled_writes_an_empty_report_and_the_cli_says_so(finetuned, tmp_path: Path) -> None:
    _, src, _, _ = finetuned
    paths = copy_project(src, tmp_path / "p")
    params = write_params(tmp_path / "params.yaml", **TINY_PRETRAIN, **TINY_FINETUNE, **{"compress.enabled": False})
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(paths.root), "compress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compress.enabled is false" in proc.stdout
    report = Paths(paths.root).compression_report
    assert check_json_seal(report, json.loads(report.read_text())) == {"enabled": False, "variants": {}}
