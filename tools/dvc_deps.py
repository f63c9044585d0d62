"""The code each stage runs, computed: written into ``dvc.yaml`` and, for a change that cannot move an
output, recorded in ``dvc.lock``.

    python -m tools.dvc_deps check   # exit 1 and the differences when dvc.yaml's code deps are not the computed ones
    python -m tools.dvc_deps write   # rewrite the pipeline/*.py deps of every dvc.yaml stage (nothing else moves)
    python -m tools.dvc_deps lock    # dvc.lock's code deps: the computed list with each file's md5 and size

A stage's code deps are the modules ``python -m pipeline <stage>`` imports: the stage's import closure
and the CLI's, imports inside functions included, ``if TYPE_CHECKING:`` imports not, with the config
sections narrowed to those the stage declares under ``params:`` (see :func:`closure`), plus the files
a stage reads without importing (:data:`FILES`). ``tests/architecture/test_architecture.py`` fails when dvc.yaml
and this computation disagree.

``lock`` is ``dvc commit`` for code alone: use it after a change that cannot alter any output (a
refactor, a comment, a new module that moved code), when the outputs are not in this checkout, so
``dvc status`` stays clean without re-running the pipeline. Data deps and outputs are never touched.
DVC's own parsers (ruamel round trip) keep the files' layout; the ``md5`` of a file is that of its
bytes, as DVC 3 records it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"
# what `python -m pipeline <stage>` imports around every stage: the CLI, its error boundary, the commit
# recovery, the checks against the base model, the stage table and the MLflow stage run (pipeline/__main__.py:
# run_command); its `models` command's imports are not followed (they never run for a stage)
CLI = (
    "pipeline.core.base_model",
    "pipeline.core.config",
    "pipeline.core.console",
    "pipeline.core.paths",
    "pipeline.core.errors",
    "pipeline.core.io",
    "pipeline.core.seals",
    "pipeline.core.stages",
    "pipeline.tracking.runs",
)
# files a stage reads without importing them
FILES = {"register": {"pipeline/serving/pyfunc_model.py"}}  # the logged model's code (mlflow python_model=)
SECTIONS = "pipeline.core.sections."


def module_file(name: str, root: Path = ROOT) -> Path:
    """The file of module ``name`` (``a.b`` -> ``a/b.py``, or ``a/b/__init__.py`` for a package)."""
    path = root.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@functools.cache  # a module is parsed once per process (every stage's closure walks the same files)
def imported_modules(name: str, root: Path = ROOT) -> frozenset[str]:
    """The ``pipeline.*`` modules ``name`` imports anywhere (top level or inside functions), except for type checking."""
    tree = ast.parse(module_file(name, root).read_text(encoding="utf-8"))
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
                found.add(sub if module_file(sub, root).exists() else node.module)
    found.discard("pipeline")
    return frozenset(found)


def closure(roots: tuple[str, ...] | list[str], sections: set[str] | None = None, root: Path = ROOT) -> set[str]:
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
        found = imported_modules(name, root)
        if name == "pipeline.core.config" and sections is not None:
            found = {m for m in found if not m.startswith(SECTIONS) or m.removeprefix(SECTIONS) in sections | {"base"}}
        todo += sorted(found - seen)
    return seen


def dvc_stages(dvc_yaml: Path) -> dict[str, dict]:
    """The ``stages:`` mapping of a ``dvc.yaml``."""
    return yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]


def declared_sections(stage: str, dvc_yaml: Path = ROOT / "dvc.yaml") -> set[str]:
    """The top-level params sections a stage lists under ``params:`` in dvc.yaml."""
    declared = dvc_stages(dvc_yaml)[stage].get("params", [])
    return {p.split(".")[0] for p in declared if isinstance(p, str)}


def stage_code_deps(stage: str, root: Path = ROOT) -> set[str]:
    """The files under pipeline/ that `python -m pipeline <stage>` runs: the stage's import closure and the CLI's
    (config sections narrowed to those the stage declares, see :func:`closure`)."""
    modules = closure([f"pipeline.stages.{stage}", *CLI], declared_sections(stage, root / "dvc.yaml"), root)
    files = {module_file(m, root) for m in modules} | {root / "pipeline" / "__main__.py"}
    # package __init__ files hold a docstring only (tests/architecture/test_architecture.py): never a dep
    code = {str(f.relative_to(root)) for f in files if f.name != "__init__.py"}
    return code | FILES.get(stage, set())


def listed_code_deps(dvc_yaml: Path, stage: str) -> set[str]:
    """The ``pipeline/*.py`` deps dvc.yaml lists for ``stage``."""
    deps = dvc_stages(dvc_yaml)[stage]["deps"]
    return {d for d in deps if d.startswith("pipeline/") and d.endswith(".py")}


def differences(root: Path = ROOT) -> list[str]:
    """One line per stage whose listed code deps are not the computed ones (empty: dvc.yaml is right)."""
    out = []
    for stage in dvc_stages(root / "dvc.yaml"):
        expected, listed = stage_code_deps(stage, root), listed_code_deps(root / "dvc.yaml", stage)
        if expected != listed:
            out.append(f"{stage}: missing {sorted(expected - listed)}, superfluous {sorted(listed - expected)}")
    return out


_CODE_DEP = re.compile(r"^(\s+)- pipeline/\S+\.py\s*$")
_STAGE = re.compile(r"^  ([A-Za-z0-9_-]+):\s*(#.*)?$")


def write_dvc_yaml(root: Path = ROOT) -> list[str]:
    """Rewrite each stage's ``pipeline/*.py`` deps in ``dvc.yaml`` as computed, in place of the old ones
    (sorted; comments, data deps and everything else untouched); returns the stages that changed."""
    path = root / "dvc.yaml"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    out: list[str] = []
    stage, changed, written = None, [], False
    for line in lines:
        if m := _STAGE.match(line):
            stage, written = m.group(1), False
        if stage and (m := _CODE_DEP.match(line)):
            if not written:
                out += [f"{m.group(1)}- {dep}\n" for dep in sorted(stage_code_deps(stage, root))]
                written = True
                if listed_code_deps(path, stage) != stage_code_deps(stage, root):
                    changed.append(stage)
            continue
        out.append(line)
    path.write_text("".join(out), encoding="utf-8")
    return changed


def file_hash(path: Path) -> tuple[str, int]:
    """The md5 and size DVC 3 records for a file dep."""
    data = path.read_bytes()
    return hashlib.md5(data).hexdigest(), len(data)


def sync_lock(root: Path = ROOT) -> list[str]:
    """Set each locked stage's ``pipeline/*.py`` deps in ``dvc.lock`` to dvc.yaml's, with the files' current md5
    and size (entries added and removed as needed, sorted by path as DVC writes them); returns the changed paths."""
    from dvc.utils.serialize import modify_yaml

    changed: set[str] = set()
    with modify_yaml(root / "dvc.lock") as lock:
        for stage, entry in lock["stages"].items():
            wanted = listed_code_deps(root / "dvc.yaml", stage)
            old = {d["path"]: d for d in entry.get("deps", []) if _is_code(d["path"])}
            keep = [d for d in entry.get("deps", []) if not _is_code(d["path"])]
            code = []
            for dep in sorted(wanted):
                md5, size = file_hash(root / dep)
                before = old.get(dep)
                if before is None or before.get("md5") != md5 or before.get("size") != size:
                    changed.add(dep)
                code.append({"path": dep, "hash": "md5", "md5": md5, "size": size})
            changed |= set(old) - wanted
            entry["deps"] = sorted(keep + code, key=lambda d: d["path"])
    return sorted(changed)


def _is_code(path: str) -> bool:
    return path.startswith("pipeline/") and path.endswith(".py")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "check"
    if command == "check":
        diff = differences()
        print("\n".join(diff) if diff else "dvc.yaml lists exactly the code each stage runs")
        return 1 if diff else 0
    if command == "write":
        changed = write_dvc_yaml()
        print(f"dvc.yaml: code deps rewritten for {changed}" if changed else "dvc.yaml: already right")
        return 0
    if command == "lock":
        if diff := differences():
            print("dvc.yaml is not up to date (run `python -m tools.dvc_deps write` first):\n" + "\n".join(diff))
            return 1
        changed = sync_lock()
        print(f"dvc.lock: recorded {changed}" if changed else "dvc.lock: code deps already recorded")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
