"""The DAPT study (studies/dapt_study.py): its statistics, and a tiny real study end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from studies import dapt_study as ds

from .conftest import ROOT


def _result(variant: str, seed: int, a: float, b: float) -> dict:
    return {
        "variant": variant,
        "seed": seed,
        "test": {"a": {"primary": "f1", "value": a}, "b": {"primary": "accuracy", "value": b}},
    }


def test_summary_is_mean_std_over_seeds_and_paired_differences() -> None:
    encoders = [
        ds.Encoder("base", 0, Path("."), Path("."), Path("."), 20.0, True),
        ds.Encoder("dapt@10", 10, Path("."), Path("."), Path("."), 10.0, True),
    ]
    results = [
        _result("base", 1, 0.50, 0.70),
        _result("base", 2, 0.60, 0.70),
        _result("base", 3, 0.70, 0.70),
        _result("dapt@10", 1, 0.55, 0.70),
        _result("dapt@10", 2, 0.66, 0.70),
        _result("dapt@10", 3, 0.77, 0.70),
    ]
    s = ds.summarise(results, encoders, {"a": 0.0, "b": 0.5})
    base, dapt = s["rows"]
    assert base["a"]["mean"] == pytest.approx(0.6) and base["a"]["std"] == pytest.approx(0.1)  # sample std
    assert dapt["a"]["delta"]["per_seed"] == pytest.approx([0.05, 0.06, 0.07])
    lo, hi = dapt["a"]["delta"]["ci95"]
    assert (lo + hi) / 2 == pytest.approx(0.06) and (hi - lo) / 2 == pytest.approx(4.303 * 0.01 / 3**0.5, rel=1e-4)
    assert dapt["b"]["delta"]["ci95"] == pytest.approx([0.0, 0.0])
    assert dapt["mean"]["values"] == pytest.approx([0.625, 0.68, 0.735])
    lines = ds.verdict(s)
    assert "- dapt@10 on a: better than base (+6.0 points" in lines[0]
    assert "- dapt@10 on b: not distinguishable from base" in lines[1]


@pytest.mark.parametrize(
    ("confidence", "df", "table"),
    [
        (0.95, 1, 12.706),
        (0.95, 2, 4.303),
        (0.95, 9, 2.262),
        (0.95, 10, 2.228),
        (0.95, 12, 2.179),
        (0.95, 30, 2.042),
        (0.95, 100, 1.984),
        (0.90, 5, 2.015),
        (0.99, 20, 2.845),
    ],
)
def test_t_quantile_matches_the_printed_table_beyond_nine_degrees_of_freedom(
    confidence: float, df: int, table: float
) -> None:
    # printed two-sided Student-t critical values; the old hard-coded table fell back to 1.96 for df >= 10
    assert ds.t_quantile(confidence, df) == pytest.approx(table, abs=5e-4)


def test_t_interval_of_many_seeds_is_wider_than_the_normal_approximation() -> None:
    diffs = [0.01 * i for i in range(11)]  # df = 10: mean 0.05, sample std 0.0332
    lo, hi = ds.t_interval(diffs)
    se = 0.033166 / 11**0.5
    assert (hi - lo) / 2 == pytest.approx(2.228 * se, rel=1e-3)
    assert (hi - lo) / 2 > 1.96 * se * 1.1


def test_spec_is_strict(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("profile: smoke\nseeds: [1]\ndapt_budgets: [4, 2]\nhead_fit_steps: 1\n")
    with pytest.raises(ds.ConfigError, match="dapt_budgets"):
        ds.load_spec(spec)
    spec.write_text("profile: smoke\nseeds: [1]\ndapt_budgets: [2]\nhead_fit_steps: 1\nseed: 3\n")
    with pytest.raises(ds.ConfigError, match="seed"):
        ds.load_spec(spec)


@pytest.mark.slow
def test_a_tiny_study_runs_logs_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Smoke profile (tiny scratch BERT, demo data), 2 seeds, every variant: report, plot, MLflow runs, resume."""
    from mlflow import MlflowClient

    from flows.stages import profile_overrides
    from pipeline.core.config import load_config
    from pipeline.core.paths import Paths
    from pipeline.text import demo_domain as demo

    project = tmp_path / "project"
    shutil.copytree(ROOT / "profiles", project / "profiles")
    shutil.copy(ROOT / "params.yaml", project / "params.yaml")
    demo.run(load_config(project / "params.yaml", profile_overrides(project, "smoke")).demo, Paths(project).demo)
    spec = project / "tiny.yaml"
    spec.write_text(
        "profile: smoke\nseeds: [1, 2]\ndapt_budgets: [2, 4]\nhead_fit_steps: 2\nvocab_extension: true\ntapt_steps: 2\n"
        "overrides: {finetune.max_steps: 6, finetune.eval_steps: 3}\n"
        "recipes:\n"
        "  dapt+macbert: {pretrain: {pretrain.masking: ngram, pretrain.mask_token: similar}}\n"
        "  dapt+fgm: {finetune: {finetune.adversarial: fgm}, choose: {finetune.adversarial_epsilon: [0.5, 2.0]}}\n"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    summary = ds.run_study(spec, project, tmp_path / "work", tmp_path / "out")

    variants = [r["variant"] for r in summary["rows"]]
    assert variants == ["base", "dapt@2", "dapt@4", "dapt+vocab", "dapt+tapt", "dapt+macbert", "dapt+fgm"]
    assert all(len(r["role"]["values"]) == 2 for r in summary["rows"])
    ppl = {r["variant"]: r["perplexity"] for r in summary["rows"]}
    assert ppl["dapt@4"] < ppl["base"]  # more MLM steps on the corpus, lower held-out perplexity (same masks)
    md = (tmp_path / "out" / "tiny.md").read_text()
    assert "| dapt+vocab | 4 |" in md and " ± " in md and "*" in md  # the vocab variant's perplexity is flagged
    rows = {r["variant"]: r for r in summary["rows"]}
    assert not rows["dapt+macbert"]["perplexity_comparable"] and rows["dapt+fgm"]["perplexity_comparable"]
    sel = rows["dapt+fgm"]["selection"]
    assert sel["key"] == "finetune.adversarial_epsilon" and set(sel["dev_mean_primary"]) == {"0.5", "2.0"}
    assert sel["dev_mean_primary"][str(sel["chosen"])] == max(sel["dev_mean_primary"].values())  # best on dev
    assert rows["dapt+fgm"]["finetune_overrides"] == {"finetune.adversarial": "fgm", **{sel["key"]: sel["chosen"]}}
    assert rows["dapt+fgm"]["mean"]["delta_ref"]["per_seed"] == pytest.approx(
        [a - b for a, b in zip(rows["dapt+fgm"]["mean"]["values"], rows["dapt@4"]["mean"]["values"], strict=True)]
    )
    assert any(line.startswith("- dapt+fgm on mean:") and " dapt@4 (" in line for line in md.splitlines())
    assert "chosen on the dev sets" in md
    assert (tmp_path / "out" / "tiny.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "out" / "tiny.json").read_text())
    assert len(saved["results"]) == 14

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("adaptbert-study")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    (parent,) = [r for r in runs if r.info.run_name == "dapt-study:tiny"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    finetunes = [r for r in children if r.data.tags.get("study.role") == "finetune"]
    assert len(finetunes) == 14 and len([r for r in children if r.data.tags.get("study.role") == "pretrain"]) == 5
    assert {r.data.params["variant"] for r in finetunes} == set(variants)
    assert all("test_role_macro_f1" in r.data.metrics for r in finetunes)
    assert "mean_primary.dapt-4" in parent.data.metrics

    # a second call resumes: every result is on disk, nothing retrains, the numbers are the same
    again = ds.run_study(spec, project, tmp_path / "work", tmp_path / "out")
    assert [r["role"]["values"] for r in again["rows"]] == [r["role"]["values"] for r in summary["rows"]]
