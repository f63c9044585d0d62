"""The DAPT study (studies/dapt_study.py): its statistics, and a tiny real study end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.core.errors import ConfigError
from pipeline.core.io import read_report
from pipeline.core.reports.pretrain import PretrainReport
from studies import dapt_study as ds
from tests.conftest import ROOT, corpus_texts


def _result(variant: str, seed: int, a: float, b: float, fraction: float = 1.0) -> dict:
    return {
        "variant": variant,
        "seed": seed,
        "label_fraction": fraction,
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


def test_label_fractions_are_summarised_apart_and_read_per_fraction() -> None:
    encoders = [ds.Encoder(v, 0, Path("."), Path("."), Path("."), None, True) for v in ("base", "dapt@10")]
    results = [
        # 10% of the labels: dapt gains 0.10, 0.12, 0.14 on task a; all labels: 0.01, 0.00, 0.02
        *(_result("base", s, 0.30 + s / 100, 0.5, 0.1) for s in (1, 2, 3)),
        *(_result("dapt@10", s, 0.38 + 0.03 * s, 0.5, 0.1) for s in (1, 2, 3)),
        *(_result("base", s, 0.80, 0.7) for s in (1, 2, 3)),
        *(_result("dapt@10", s, 0.80 + d, 0.7) for s, d in ((1, 0.01), (2, 0.0), (3, 0.02))),
    ]
    spec = ds.StudySpec(profile=None, seeds=[1, 2, 3], dapt_budgets=[10], head_fit_steps=1, label_fractions=[0.1, 1.0])
    s = ds.summarise_fractions(spec, results, encoders, {"a": 0.0, "b": 0.5})
    assert s["label_fraction"] == 1.0 and s["rows"][1]["a"]["delta"]["per_seed"] == pytest.approx([0.01, 0.0, 0.02])
    (low, full) = s["label_efficiency"]
    assert low["fraction"] == 0.1 and full["rows"] == s["rows"]
    assert low["rows"][1]["a"]["delta"]["per_seed"] == pytest.approx([0.10, 0.12, 0.14])
    md = ds.label_efficiency_section(s)
    assert "| 10% | dapt@10 | 44.0 ± 3.0 | +12.0 [" in md and "| 100% | base | 80.0 ± 0.0 |" in md
    assert "- dapt@10 with 10% of the labels on a: better than base (+12.0 points" in md
    assert "with 100% of the labels" not in md  # the main reading covers the largest fraction
    one = ds.StudySpec(profile=None, seeds=[1], dapt_budgets=[10], head_fit_steps=1)
    assert ds.summarise_fractions(one, results[6:], encoders, {"a": 0, "b": 0})["label_efficiency"] == []
    assert ds.label_efficiency_section({"label_efficiency": []}) == ""


def test_train_subset_is_seeded_nested_per_task_and_keeps_qa_windows_together() -> None:
    from datasets import Dataset

    from pipeline.training.data import train_subset
    from pipeline.training.multitask import TaskData

    def task(name: str, cols: dict) -> TaskData:
        splits = {"train": Dataset.from_dict(cols), "validation": "dev", "test": "test"}
        return TaskData(SimpleNamespace(name=name), splits, {"train": ["gold"]})  # type: ignore[arg-type]

    a, b = task("a", {"x": list(range(200))}), task("b", {"x": list(range(200))})
    tenth = train_subset(a, 0.1, seed=1).splits["train"]["x"]
    third = train_subset(a, 0.3, seed=1).splits["train"]["x"]
    assert len(tenth) == 20 and len(third) == 60 and set(tenth) < set(third)  # nested at one seed
    assert train_subset(a, 0.1, seed=1).splits["train"].data.num_rows == 20  # the Arrow table itself, not an index
    assert tenth == sorted(tenth)  # file order kept
    assert tenth == train_subset(a, 0.1, seed=1).splits["train"]["x"]  # the same for every encoder
    assert tenth != train_subset(a, 0.1, seed=2).splits["train"]["x"]  # another seed, another subset
    assert tenth != train_subset(b, 0.1, seed=1).splits["train"]["x"]  # each task draws its own
    assert train_subset(a, 1.0, seed=1) is a and train_subset(a, 0.001, seed=1).splits["train"].num_rows == 1
    sub = train_subset(a, 0.5, seed=1)
    assert sub.splits["validation"] == "dev" and sub.rows == a.rows  # only train features shrink
    qa = task("qa", {"example_id": [f"q{i // 3}" for i in range(30)], "x": list(range(30))})  # 10 examples x 3 windows
    kept = train_subset(qa, 0.5, seed=1).splits["train"]["example_id"]
    assert len(set(kept)) == 5 and all(kept.count(q) == 3 for q in set(kept))
    with pytest.raises(ValueError, match="fraction"):
        train_subset(a, 0.0, seed=1)


def test_spec_is_strict(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("profile: smoke\nseeds: [1]\ndapt_budgets: [4, 2]\nhead_fit_steps: 1\n")
    with pytest.raises(ds.ConfigError, match="dapt_budgets"):
        ds.load_spec(spec)
    spec.write_text("profile: smoke\nseeds: [1]\ndapt_budgets: [2]\nhead_fit_steps: 1\nseed: 3\n")
    with pytest.raises(ds.ConfigError, match="seed"):
        ds.load_spec(spec)
    for fractions in ("[0.5, 0.1]", "[0, 1]", "[1.5]", "[0.5, 0.5]", "[]"):
        spec.write_text(
            f"profile: smoke\nseeds: [1]\ndapt_budgets: [2]\nhead_fit_steps: 1\nlabel_fractions: {fractions}\n"
        )
        with pytest.raises(ds.ConfigError, match="label_fractions"):
            ds.load_spec(spec)
    spec.write_text(
        "profile: smoke\nseeds: [1]\ndapt_budgets: [2]\nhead_fit_steps: 1\nrecipes:\n  r: {equal_minutes: true}\n"
    )
    with pytest.raises(ds.ConfigError, match="equal_minutes: the recipe trains plain DAPT's encoder"):
        ds.load_spec(spec)


# Half the smoke profile's task examples: a study scores every fine-tuned model on each task's dev and test split
# (and nearest+tapt embeds every train input), and these tests count results, not accuracy
HALF_TASKS = {"demo.role_examples": 200, "demo.pair_examples": 150, "demo.ner_examples": 150, "demo.qa_examples": 100}


def _smoke_project(tmp_path: Path, corpus_docs: int | None = None) -> Path:
    """A project root with params.yaml, the profiles and the smoke profile's demo data, with :data:`HALF_TASKS`
    (and ``corpus_docs`` documents instead of the profile's 400 where given)."""
    from pipeline.core.config import load_config
    from pipeline.core.paths import Paths
    from pipeline.core.profiles import profile_overrides
    from pipeline.text import demo_domain as demo

    project = tmp_path / "project"
    shutil.copytree(ROOT / "profiles", project / "profiles")
    shutil.copy(ROOT / "params.yaml", project / "params.yaml")
    overrides = profile_overrides(project, "smoke") | HALF_TASKS
    overrides |= {"demo.corpus_docs": corpus_docs} if corpus_docs else {}
    demo.run(load_config(project / "params.yaml", overrides).demo, Paths(project).demo)
    return project


@pytest.mark.slow
def test_a_tiny_study_runs_logs_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Smoke profile (tiny scratch BERT, demo data), 2 seeds, every variant: report, plot, MLflow runs, resume."""
    from mlflow import MlflowClient

    project = _smoke_project(tmp_path)
    spec = project / "tiny.yaml"
    spec.write_text(
        "profile: smoke\nseeds: [1, 2]\ndapt_budgets: [2, 4]\nhead_fit_steps: 2\nvocab_extension: true\ntapt_steps: 0\n"
        "overrides: {finetune.max_steps: 6, finetune.eval_steps: 3}\n"
        "recipes:\n"
        "  dapt+macbert: {pretrain: {pretrain.masking: ngram, pretrain.mask_token: similar}}\n"
        "  dapt+fgm: {finetune: {finetune.adversarial: fgm}, choose: {finetune.adversarial_epsilon: [0.5, 2.0]}}\n"
        "  electra: {pretrain: {pretrain.objective: electra}, equal_minutes: true}\n"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    summary = ds.run_study(spec, project, tmp_path / "work", tmp_path / "out")

    variants = [r["variant"] for r in summary["rows"]]
    assert variants == ["base", "dapt@2", "dapt@4", "dapt+vocab", "dapt+macbert", "dapt+fgm", "electra"]
    assert all(len(r["role"]["values"]) == 2 for r in summary["rows"])
    ppl = {r["variant"]: r["perplexity"] for r in summary["rows"]}
    assert ppl["dapt@4"] < ppl["base"]  # more MLM steps on the corpus, lower held-out perplexity (same masks)
    md = (tmp_path / "out" / "tiny.md").read_text()
    assert "| dapt+vocab | 4 |" in md and " ± " in md and "*" in md  # the vocab variant's perplexity is flagged
    rows = {r["variant"]: r for r in summary["rows"]}
    assert not rows["dapt+macbert"]["perplexity_comparable"] and rows["dapt+fgm"]["perplexity_comparable"]
    # ELECTRA at plain DAPT's minutes: its budget is the DAPT run's training time, its perplexity the generator's
    dapt_seconds = read_report(tmp_path / "work" / "dapt" / "reports" / "pretrain.json", PretrainReport).train_seconds
    electra = read_report(tmp_path / "work" / "electra" / "reports" / "pretrain.json", PretrainReport)
    assert dapt_seconds is not None and electra.objective == "electra" and electra.budget is not None
    assert electra.budget.minutes_asked == round(dapt_seconds / 60, 3)
    assert rows["electra"]["dapt_steps"] == electra.global_step and not rows["electra"]["perplexity_comparable"]
    assert rows["electra"]["mean"]["delta_ref"] is not None  # compared with plain DAPT, paired by seed
    assert rows["electra"]["minutes"]["asked"] == electra.budget.minutes_asked
    assert "- electra: fine-tuned with plain fine-tuning; pretrained for plain DAPT's" in md
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
    assert len(saved["results"]) == 14 and "## Label efficiency" not in md  # one label fraction: no such section

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


@pytest.mark.slow
def test_a_tiny_study_with_tapt_knn_tapt_and_label_fractions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TAPT from the base model and after DAPT, a nearest+TAPT recipe (the select stage in the study), and every
    variant fine-tuned on half and on all of the train labels (same subsets across variants)."""

    from pipeline.core.paths import Paths
    from pipeline.tasks.encoding import task_train_inputs

    project = _smoke_project(tmp_path, corpus_docs=150)  # nearest+tapt embeds every corpus block with MiniLM
    spec = project / "labels.yaml"
    spec.write_text(
        "profile: smoke\nseeds: [1, 2]\ndapt_budgets: [2]\nhead_fit_steps: 2\nvocab_extension: false\ntapt_steps: 2\n"
        "label_fractions: [0.5, 1.0]\n"
        # 150 demo reports keep ~64 after decontamination (the demo's templates near-copy its test sentences)
        "overrides: {finetune.max_steps: 6, finetune.eval_steps: 3, validate.corpus.min_docs: 40}\n"
        "recipes:\n"
        "  nearest+tapt:\n"
        "    pretrain: {pretrain.selection.mode: nearest, pretrain.selection.k: 2, pretrain.task_text: true}\n"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    work = tmp_path / "work"
    summary = ds.run_study(spec, project, work, tmp_path / "out")

    variants = ["base", "dapt@2", "tapt", "dapt+tapt", "nearest+tapt"]
    assert [r["variant"] for r in summary["rows"]] == variants and summary["label_fraction"] == 1.0
    assert [level["fraction"] for level in summary["label_efficiency"]] == [0.5, 1.0]
    saved = json.loads((tmp_path / "out" / "labels.json").read_text())
    assert len(saved["results"]) == 5 * 2 * 2
    half = {(r["variant"], r["seed"]): r["train_examples"] for r in saved["results"] if r["label_fraction"] == 0.5}
    full = {(r["variant"], r["seed"]): r["train_examples"] for r in saved["results"] if r["label_fraction"] == 1.0}
    for key, sizes in half.items():
        assert sizes.keys() == full[key].keys()
        assert all(0 < n < full[key][t] for t, n in sizes.items() if t != "qa")  # QA counts windows: whole examples
        assert sizes == half[("base", key[1])]  # every variant gets the same subset at a seed
    low = summary["label_efficiency"][0]["rows"]
    base_half = {r["seed"]: r for r in saved["results"] if r["variant"] == "base" and r["label_fraction"] == 0.5}
    tapt_half = {r["seed"]: r for r in saved["results"] if r["variant"] == "tapt" and r["label_fraction"] == 0.5}
    assert low[2]["role"]["delta"]["per_seed"] == pytest.approx(
        [tapt_half[s]["test"]["role"]["value"] - base_half[s]["test"]["role"]["value"] for s in (1, 2)]
    )

    # TAPT trains on the pipeline's task text: every task's distinct train inputs, labels left out
    texts = corpus_texts(Paths(work / "tapt-data"), "train")
    assert texts == [t for _, t in task_train_inputs(Paths(work / "data").tasks)]
    assert {"tapt", "dapt-tapt"} <= {p.name for p in work.iterdir()}
    # nearest+tapt: the select stage ran in the recipe's root and its DAPT trained on the chosen blocks + task text
    knn = Paths(work / "nearest-tapt")
    selected = json.loads(knn.select_report.read_text())
    pretrain = read_report(knn.pretrain_report, PretrainReport)
    assert selected["mode"] == "nearest" and pretrain.task_text_blocks > 0
    assert pretrain.train_blocks == selected["selected_blocks"] + pretrain.task_text_blocks

    md = (tmp_path / "out" / "labels.md").read_text()
    assert "## Label efficiency" in md and "| 50% | nearest+tapt |" in md and "with 50% of the labels on" in md
    assert (tmp_path / "out" / "labels.png").stat().st_size > 20_000


@pytest.mark.slow
def test_the_recipe_study_trains_every_arm_and_seed_on_dev_and_pairs_them_by_seed(tmp_path: Path) -> None:
    """studies.finetune_recipe on the smoke profile: two arms, each run in a process of its own; the summary's paired
    delta is the mean of the same-seed differences; a finished run is not trained again."""
    import json

    from studies import finetune_recipe

    spec = tmp_path / "tiny_recipe.yaml"
    spec.write_text(
        "profile: smoke\nseeds: [13]\narms:\n  steps: {}\n"
        "  epochs: {finetune.epochs: 1, finetune.tasks.ner.epochs: 3, finetune.max_steps: 1000}\nparallel: 2\n"
    )
    project = _smoke_project(tmp_path)
    summary = finetune_recipe.run_study(spec, project, tmp_path / "work", tmp_path / "out")
    record = json.loads((tmp_path / "out" / "tiny_recipe.json").read_text())
    runs = {(r["arm"], r["seed"]): r for r in record["runs"]}
    assert set(runs) == {("steps", 13), ("epochs", 13)}
    assert all(r["steps"] == 30 for (a, _), r in runs.items() if a == "steps")  # the smoke profile's budget
    epochs = runs[("epochs", 13)]["planned_epochs"]
    assert epochs["ner"] == pytest.approx(3.0, rel=0.1) and epochs["role"] == pytest.approx(1.0, rel=0.1)
    assert set(runs[("steps", 13)]["dev"]) >= {"ner:viterbi", "ner:argmax", "role", "pair", "qa"}
    tasks = summary["tasks"]
    diffs = [
        finetune_recipe.primary_dev(runs[("epochs", s)], tasks)["mean"]
        - finetune_recipe.primary_dev(runs[("steps", s)], tasks)["mean"]
        for s in (13,)
    ]
    assert summary["arms"]["epochs"]["delta mean"][0] == pytest.approx(sum(diffs))
    assert "| epochs |" in (tmp_path / "out" / "tiny_recipe.md").read_text()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "work" / "runs").glob("*.json")}
    finetune_recipe.run_study(
        spec, project, tmp_path / "work", tmp_path / "out"
    )  # every run kept: nothing trained again
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "work" / "runs").glob("*.json")} == before
    spec.write_text("profile: smoke\nseeds: [1]\narms:\n  a: {pretrain.max_steps: 3}\n")
    with pytest.raises(ConfigError, match=r"keys must start with 'finetune\.'"):
        finetune_recipe.load_recipe_spec(spec)
