"""The stage table (pipeline/core/stages.py) is the one record of a stage: it matches dvc.yaml and every name
it holds resolves (a Paths attribute, a renderer, a stage module)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import yaml

from pipeline.core.errors import MissingInput
from pipeline.core.io import missing_input, read_report, require_inputs, sealed, write_json
from pipeline.core.paths import Paths
from pipeline.core.stages import NAMES, STAGES, Stage, producer_of, stage_record
from pipeline.reporting import views
from tests.conftest import ROOT


def test_the_table_lists_dvc_yamls_stages_in_its_order() -> None:
    declared = list(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    assert list(NAMES) == declared


@pytest.mark.parametrize("stage", STAGES, ids=NAMES)
def test_a_records_inputs_are_its_dvc_deps_that_other_stages_write(stage: Stage) -> None:
    """The inputs whose seals the CLI checks before a stage runs (pipeline.core.seals) are what DVC tracks for it."""
    deps = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][stage.name].get("deps", [])
    written = {d for d in deps if producer_of(Path(d)) not in (None, stage.name)}
    relative = Paths(Path())
    assert {str(getattr(relative, name)) for name in stage.inputs} == written


@pytest.mark.parametrize("stage", STAGES, ids=NAMES)
def test_every_name_in_a_record_resolves(stage: Stage) -> None:
    module = ast.parse((ROOT / "pipeline" / "stages" / f"{stage.name}.py").read_text(encoding="utf-8"))
    functions = {node.name for node in module.body if isinstance(node, ast.FunctionDef)}
    assert {"run", "summary"} <= functions, f"pipeline/stages/{stage.name}.py: run(cfg, paths) and summary(...)"
    attributes = {n for n, v in inspect.getmembers(Paths) if isinstance(v, property)}
    named = [stage.report] if stage.report else []
    named += [*stage.artifacts, *(v.source for v in stage.views)]
    assert set(named) <= attributes, f"{stage.name}: {sorted(set(named) - attributes)} are not Paths attributes"
    for view in stage.views:
        assert (view.render is None) == (view.kind == "link"), view.key  # a link renders nothing
        assert view.render is None or callable(getattr(views, view.render, None)), f"no views.{view.render}"
    assert stage.metrics or not stage.setup, "set-up params come from a report that also has metrics"


def test_view_keys_are_unique_and_prefixed() -> None:
    keys = [v.key for s in STAGES for v in s.views]
    assert len(keys) == len(set(keys)) and all(k.startswith("adaptbert-") for k in keys)


def test_a_views_renderer_takes_the_type_its_report_is_read_as() -> None:
    """The flow reads a typed report through its model and hands it to the view's renderer (``getattr``: mypy cannot
    see the call): each renderer's parameter names that model, the untyped reports' renderers a dict (an ingest view
    still reading a dict failed every flow run once the ingest report became a type)."""
    from pipeline.core.reports.kinds import TYPED_REPORTS

    for view in (v for s in STAGES for v in s.views if v.render):
        (param,) = inspect.signature(getattr(views, view.render)).parameters.values()
        kind = TYPED_REPORTS.get(view.source)
        expected = kind.__name__ if kind else "dict[str, Any]"
        assert param.annotation == expected, f"{view.render}({param.annotation}) reads {view.source} as {expected}"


def test_an_unknown_stage_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        stage_record("nope")


def test_the_flow_publishes_each_view_of_the_record(tmp_path, monkeypatch) -> None:
    """publish_stage_artifacts is one loop over the record: a view is published when its source exists and its
    renderer has something to show, under its key and kind."""
    import flows.pipeline as fp

    published: list[tuple[str, str]] = []
    for kind in ("table", "markdown", "link"):
        monkeypatch.setattr(fp, f"create_{kind}_artifact", lambda *a, _k=kind, **kw: published.append((_k, kw["key"])))
    paths = Paths(tmp_path)
    assert fp.publish_stage_artifacts("evaluate", paths) == [] and not published  # nothing written yet
    paths.reports.mkdir()
    paths.run_report.write_text("<html></html>")
    assert fp.publish_stage_artifacts("report", paths) == ["adaptbert-run-report"]
    write_json(paths.compression_report, sealed({"enabled": False, "variants": {}}))  # what compress writes when off
    assert fp.publish_stage_artifacts("compress", paths) == []  # compression off: its renderer shows nothing
    assert published == [("link", "adaptbert-run-report")]
    assert fp.publish_stage_artifacts("my_own_dvc_stage", paths) == []  # a stage dvc.yaml has and the table not


def dvc_outputs(stage: dict) -> set[str]:
    """A dvc.yaml stage's outs and metrics files."""
    entries = [*stage.get("outs", []), *stage.get("metrics", [])]
    return {next(iter(e)) if isinstance(e, dict) else e for e in entries}


@pytest.mark.parametrize("stage", STAGES, ids=NAMES)
def test_a_records_outputs_hold_its_dvc_outs_and_each_is_written_by_it(stage: Stage) -> None:
    declared = dvc_outputs(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][stage.name])
    relative = Paths(Path())
    recorded = {str(getattr(relative, output)) for output in stage.outputs}
    assert declared <= recorded, f"{stage.name}: dvc.yaml outs {sorted(declared - recorded)} are not in its record"
    for output in stage.outputs:
        assert producer_of(getattr(Paths(Path("/some/root")), output)) == stage.name
        assert producer_of(getattr(relative, output) / "inside.json") == stage.name


def test_a_missing_input_names_the_stage_that_writes_it(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    with pytest.raises(MissingInput, match=r"run `dvc repro tokenize`"):
        require_inputs(paths.root, paths.pretrain_blocks / "manifest.json")  # the first exists
    with pytest.raises(MissingInput, match=r"run `dvc repro select`"):
        read_report(paths.selection / "selection.json")
    assert producer_of(tmp_path / "my_corpus.jsonl") is None  # a user's input: no stage writes it
    assert "the stage that writes it" in str(missing_input(tmp_path / "my_corpus.jsonl", "missing"))


# where a stage's name is spelled out of its own module and the table, it means something else (checked by hand):
# a params.yaml section (cfg.pretrain), a folder name (Paths), a console prefix, a report key or a docstring
HOMONYMS = {
    "demo": {"pipeline/core/paths.py"},
    "validate": {"pipeline/core/config.py"},
    "register": {"pipeline/core/config.py"},
    "pretrain": {
        "pipeline/core/paths.py",
        # the pretraining package: its params section and console prefix (model, budget, session, trainer), the
        # torchrun command line (launch), its transaction (run: the pretrain stage's outputs, also an arm's)
        *(f"pipeline/training/pretraining/{m}.py" for m in ("budget", "launch", "model", "run", "session", "trainer")),
        "pipeline/training/adaptation.py",  # the params section an arm sets
        "pipeline/stages/evaluate.py",  # the precision each stage ran in
        "pipeline/tracking/runs.py",
    },
    "search": {
        "pipeline/core/paths.py",
        "pipeline/training/search.py",
        "pipeline/stages/finetune.py",
        "pipeline/reporting/evaluation.py",
    },
    "finetune": {
        "pipeline/core/paths.py",
        "pipeline/training/contenders.py",
        "pipeline/training/search.py",
        "pipeline/training/trainer.py",
        "pipeline/training/tournament.py",  # the params section an arm's fine-tuning sets
        "pipeline/stages/evaluate.py",
        "pipeline/compression/recipes.py",
    },
    "evaluate": {"flows/pipeline.py"},
    "compress": {"pipeline/core/paths.py", "pipeline/compression/recipes.py"},
    "report": {"pipeline/tracking/runs.py"},  # the MLflow artifact folder of the run report
    "adapt": {"pipeline/core/paths.py", "pipeline/training/tournament.py"},  # folders; its trainings' console prefix
}


def test_a_stage_name_is_spelled_only_in_its_module_the_table_and_known_homonyms() -> None:
    """Which stage writes an input comes from the table (producer_of), not a string at the call site."""
    sources = {
        str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
        for d in ("pipeline", "flows")
        for p in (ROOT / d).rglob("*.py")
    }
    for name in NAMES:
        allowed = {f"pipeline/stages/{name}.py", "pipeline/core/stages.py"} | HOMONYMS.get(name, set())
        found = {path for path, text in sources.items() if f'"{name}"' in text or f"'{name}'" in text}
        assert found <= allowed, f"stage '{name}' is spelled out in {sorted(found - allowed)}"


def test_no_output_dvc_caches_is_also_tracked_by_git() -> None:
    """An out DVC caches (the default, ``cache: true``) that git also tracks makes the stage fail after its work:
    "output ... is already tracked by SCM" (was: reports/compression.md, moved to DVC but left in git's index, so a
    fresh clone's `dvc repro` failed at compress). Outs with ``cache: false`` are git's on purpose."""
    import subprocess

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    cached = sorted(
        next(iter(e)) if isinstance(e, dict) else e
        for stage in stages.values()
        for e in [*stage.get("outs", []), *stage.get("metrics", []), *stage.get("plots", [])]
        if not (isinstance(e, dict) and next(iter(e.values())) and next(iter(e.values())).get("cache") is False)
    )
    assert "reports/compression.md" in cached  # what the rule covers
    tracked = subprocess.run(
        ["git", "ls-files", "--", *cached], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked == []


def test_register_has_an_output_a_fresh_clone_lacks() -> None:
    """A fresh clone holds what git tracks (and what `dvc pull` brings from DVC's cache); where every input and output
    of `register` is among them and matches dvc.lock, DVC skips the stage and the clone's registry stays empty (was:
    a fresh clone's `dvc repro` printed "Stage 'register' didn't change, skipping"). One output of it must be
    neither: not cached by DVC and ignored by git."""
    import subprocess

    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]["register"]
    uncached = [
        path
        for entry in [*stage.get("outs", []), *stage.get("metrics", [])]
        if isinstance(entry, dict)
        for path, spec in entry.items()
        if spec and spec.get("cache") is False
    ]
    ignored = [
        p for p in uncached if subprocess.run(["git", "check-ignore", "-q", p], cwd=ROOT, check=False).returncode == 0
    ]
    assert ignored == ["reports/promotion.json"]
    assert subprocess.run(["git", "ls-files", "--", *ignored], cwd=ROOT, capture_output=True, text=True).stdout == ""
