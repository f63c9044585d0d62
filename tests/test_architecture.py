"""The layout's rules, checked: stages import only the library, and dvc.yaml lists every module a stage runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from pipeline.__main__ import STAGES as PIPELINE_STAGES

from .conftest import ROOT

PACKAGE = ROOT / "pipeline"
STAGES = PIPELINE_STAGES
# what `python -m pipeline <stage>` imports around every stage: the CLI, its error boundary, the
# commit recovery and the MLflow stage run (pipeline/__main__.py: run_command); its `models`
# command's imports are not followed (they never run for a stage)
# files a stage reads without importing them
FILES = {"register": {"pipeline/serving/pyfunc_model.py"}}  # the logged model's code (mlflow python_model=)
CLI = (
    "pipeline.core.config",
    "pipeline.core.console",
    "pipeline.core.paths",
    "pipeline.core.errors",
    "pipeline.core.io",
    "pipeline.tracking.runs",
)


def module_file(name: str) -> Path:
    parts = name.split(".")
    path = ROOT.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported_modules(name: str) -> set[str]:
    """The ``pipeline.*`` modules ``name`` imports anywhere (top level or inside functions), except for type checking."""
    tree = ast.parse(module_file(name).read_text(encoding="utf-8"))
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` imports never run
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("pipeline.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            for alias in node.names:  # `from pipeline.stages import ingest` imports a module; `from x import f` a name
                sub = f"{node.module}.{alias.name}"
                found.add(sub if module_file(sub).exists() else node.module)
    found.discard("pipeline")
    return found


SECTIONS = "pipeline.core.sections."


def closure(roots: tuple[str, ...] | list[str], sections: set[str] | None = None) -> set[str]:
    """The ``pipeline.*`` modules ``roots`` import, transitively.

    With ``sections`` (the params sections a stage declares), the edges from ``pipeline.core.config``
    (the root model, which imports every section to parse the whole file) to the section modules are
    followed only for those sections: a change to a section the stage never reads cannot change its
    outputs (at worst the file stops parsing, which fails every stage loudly). A module that imports
    a section directly depends on it whatever the stage declares.
    """
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found = imported_modules(name)
        if name == "pipeline.core.config" and sections is not None:
            found = {m for m in found if not m.startswith(SECTIONS) or m.removeprefix(SECTIONS) in sections | {"base"}}
        todo += sorted(found - seen)
    return seen


def declared_sections(stage: str, dvc_yaml: Path = ROOT / "dvc.yaml") -> set[str]:
    """The top-level params sections a stage lists under ``params:`` in dvc.yaml."""
    declared = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"][stage].get("params", [])
    return {p.split(".")[0] for p in declared if isinstance(p, str)}


def stage_code_deps(stage: str) -> set[str]:
    """The files under pipeline/ that `python -m pipeline <stage>` runs: the stage's import closure and the CLI's
    (config sections narrowed to those the stage declares, see :func:`closure`)."""
    modules = closure([f"pipeline.stages.{stage}", *CLI], declared_sections(stage))
    files = {module_file(m) for m in modules} | {PACKAGE / "__main__.py"}
    code = {
        str(f.relative_to(ROOT)) for f in files if f.name != "__init__.py"
    }  # package docstrings only (tested below)
    return code | FILES.get(stage, set())


def dvc_code_deps(dvc_yaml: Path, stage: str) -> set[str]:
    deps = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"][stage]["deps"]
    return {d for d in deps if d.startswith("pipeline/") and d.endswith(".py")}


def test_package_inits_hold_only_a_docstring() -> None:
    """So that no stage needs them as deps: code in an __init__ would run unseen by dvc.yaml (constants are fine)."""
    for init in PACKAGE.rglob("__init__.py"):
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
            assert isinstance(value, ast.Constant), f"{init.relative_to(ROOT)}:{node.lineno} is code"


def test_the_cli_imports_only_what_cli_lists_besides_stages_and_the_models_command() -> None:
    extra = imported_modules("pipeline.__main__") - set(CLI) - {"pipeline.tracking.models_cli"}
    assert not extra, (
        f"pipeline/__main__.py now imports {sorted(extra)}: add them to CLI in this test (and to every stage's deps)"
    )


def test_stages_never_import_other_stages() -> None:
    for stage in STAGES:
        others = {m for m in closure([f"pipeline.stages.{stage}"]) if m.startswith("pipeline.stages.")} - {
            f"pipeline.stages.{stage}"
        }
        assert not others, f"stage {stage} imports the stage(s) {sorted(others)}: move what they share into the library"


def test_the_library_never_imports_a_stage() -> None:
    library = [p for p in PACKAGE.rglob("*.py") if "stages" not in p.parts and p.name != "__main__.py"]
    for path in library:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        stages = {m for m in imported_modules(name) if m.startswith("pipeline.stages")}
        assert not stages, f"{path.relative_to(ROOT)} imports {sorted(stages)}"


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_yaml_lists_exactly_the_code_each_stage_runs(stage: str) -> None:
    expected, listed = stage_code_deps(stage), dvc_code_deps(ROOT / "dvc.yaml", stage)
    assert not expected - listed, (
        f"dvc.yaml stage {stage} misses deps {sorted(expected - listed)}: a change there would not re-run it"
    )
    assert not listed - expected, (
        f"dvc.yaml stage {stage} lists {sorted(listed - expected)}, which it never imports: they re-run it for nothing"
    )


def project_imports(name: str) -> set[str]:
    """The modules of this repository (``pipeline``, ``flows``, ``studies``) that ``name`` imports anywhere."""
    tree = ast.parse(module_file(name).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] in ("pipeline", "flows", "studies")
        ):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if module_file(sub).exists() else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in ("pipeline", "flows", "studies")}
    return {m for m in found if module_file(m).exists()}


@pytest.mark.parametrize("study", sorted(yaml.safe_load((ROOT / "studies" / "dvc.yaml").read_text())["stages"]))
def test_studies_dvc_yaml_covers_the_code_each_study_runs(study: str) -> None:
    """A study imports its driver, flows' profile code and stages; every such file lies under a listed dep."""
    seen: set[str] = set()
    todo = ["studies.dapt_study"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(project_imports(name) - seen)
    files = {str(module_file(m).relative_to(ROOT)) for m in seen}
    deps = yaml.safe_load((ROOT / "studies" / "dvc.yaml").read_text())["stages"][study]["deps"]
    uncovered = sorted(f for f in files if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))
    assert not uncovered, f"studies/dvc.yaml stage {study} misses deps {uncovered}"


def test_the_closure_check_fails_on_a_missing_dep(tmp_path: Path) -> None:
    """The check above can fail: drop one module from a stage's deps and it names it."""
    data = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    data["stages"]["evaluate"]["deps"].remove("pipeline/tasks/metrics.py")
    broken = tmp_path / "dvc.yaml"
    broken.write_text(yaml.safe_dump(data))
    assert stage_code_deps("evaluate") - dvc_code_deps(broken, "evaluate") == {"pipeline/tasks/metrics.py"}


# ----------------------------------------------------------------------------- params


def config_sections_read(module: str) -> set[str]:
    """Top-level ``Config`` fields read in ``module``: attributes of every parameter annotated ``Config``."""
    from pipeline.core.config import Config

    fields = {name: (info.alias or name) for name, info in Config.model_fields.items()}  # validation -> validate
    read: set[str] = set()
    for fn in ast.walk(ast.parse(module_file(module).read_text(encoding="utf-8"))):
        if not isinstance(fn, ast.FunctionDef):
            continue
        names = {
            a.arg
            for a in fn.args.args + fn.args.kwonlyargs
            if isinstance(a.annotation, ast.Name) and a.annotation.id == "Config"
        }
        for node in ast.walk(fn):
            is_field = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names
            if is_field and node.attr in fields:  # model_dump and friends are not sections
                read.add(fields[node.attr])
    return read


# around every stage: MLflow location and retries, the schedule; read by the CLI, never a reason to re-run a stage
INFRASTRUCTURE = {"pipeline.core.config", "pipeline.tracking.runs", "pipeline.__main__"}


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_yaml_params_are_exactly_the_sections_each_stage_reads(stage: str) -> None:
    read = set().union(*(config_sections_read(m) for m in closure([f"pipeline.stages.{stage}"]) - INFRASTRUCTURE))
    sections = declared_sections(stage)
    assert read - sections == set(), f"dvc.yaml stage {stage} reads {sorted(read - sections)} but does not declare them"
    assert sections - read == set(), f"dvc.yaml stage {stage} declares {sorted(sections - read)} but never reads them"


def test_mlflow_stage_runs_log_the_params_dvc_yaml_declares() -> None:
    from pipeline.tracking.runs import as_params, stage_params

    from .conftest import make_config

    cfg = make_config()
    for stage in STAGES:
        declared = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"][stage].get("params", [])
        logged = as_params(cfg, stage_params(ROOT, stage))
        assert {k.split(".")[0] for k in logged} == {p.split(".")[0] for p in declared}, stage
        assert all(any(k == p or k.startswith(f"{p}.") for p in declared) for k in logged), stage


def test_the_params_check_sees_reads_through_the_library() -> None:
    """It can fail: evaluate reads ``finetune`` only through ``tasks/data.py: load_tasks`` (per-task settings), which
    dvc.yaml then has to declare; without that entry the check above names the section."""
    assert "finetune" in config_sections_read("pipeline.tasks.data")
    assert "finetune" not in config_sections_read("pipeline.stages.evaluate")
    assert {"pretrain", "seed", "precision"} <= config_sections_read("pipeline.stages.pretrain")
