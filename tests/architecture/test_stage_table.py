"""The stage table (pipeline/core/stages.py) is the one record of a stage: it matches dvc.yaml and every name
it holds resolves (a Paths attribute, a renderer, a stage module)."""

from __future__ import annotations

import ast
import inspect

import pytest
import yaml

from pipeline.core.paths import Paths
from pipeline.core.stages import NAMES, STAGES, Stage, stage_record
from pipeline.reporting import views
from tests.conftest import ROOT


def test_the_table_lists_dvc_yamls_stages_in_its_order() -> None:
    declared = list(yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"])
    assert list(NAMES) == declared


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
    paths.compression_report.write_text('{"enabled": false}')
    assert fp.publish_stage_artifacts("compress", paths) == []  # compression off: its renderer shows nothing
    assert published == [("link", "adaptbert-run-report")]
    assert fp.publish_stage_artifacts("my_own_dvc_stage", paths) == []  # a stage dvc.yaml has and the table not
