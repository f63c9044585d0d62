"""The commands the README and docs/ show are real: every one names a program that exists, and the cheap ones run."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTERNAL = {
    "pip",
    "dvc",
    "mlflow",
    "prefect",
    "ray",
    "curl",
    "export",
    "git",
    "cat",
    "iconv",
}  # installed tools, not ours


def fenced_commands(page: Path) -> list[str]:
    """Shell commands in ```bash blocks: comments dropped, continuation lines and JSON bodies skipped."""
    commands, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```bash"
            continue
        text = line.split(" #")[0].strip()
        if inside and text and not text.startswith(("#", "{", "[", '"', "-", "'")) and re.match(r"^[a-zA-Z]", text):
            commands.append(text)
    return commands


ALL = sorted({(page.name, cmd) for page in PAGES for cmd in fenced_commands(page)})
SCRIPTS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def program(cmd: str) -> tuple[str, str | None]:
    """The program a command runs: ``("python -m", module)``, ``(script, None)``."""
    words = cmd.split()  # the first words only: a curl body may open a quote that a later line closes
    if words[:2] == ["python", "-m"]:
        return "python -m", words[2]
    return words[0], None


def test_the_pages_show_commands() -> None:
    assert len(ALL) >= 20 and any(cmd == "dvc repro" for _, cmd in ALL)  # the extraction finds the blocks


@pytest.mark.parametrize(("page", "cmd"), ALL)
def test_every_documented_command_names_a_program_that_exists(page: str, cmd: str) -> None:
    prog, module = program(cmd)
    if module is not None:
        assert importlib.util.find_spec(module) is not None, f"{page}: `{cmd}`: no module {module}"
    else:
        assert prog in SCRIPTS | EXTERNAL, f"{page}: `{cmd}`: {prog} is neither an adaptbert script nor a known tool"


OURS = ("pipeline", "flows.profile", "flows.serve", "benchmarks", "benchmarks.ingest", "studies.dapt_study")
CHEAP = sorted({cmd for _, cmd in ALL if program(cmd)[1] in OURS or program(cmd)[0] in SCRIPTS})


@pytest.mark.parametrize("cmd", CHEAP)
def test_the_cheap_commands_run(cmd: str) -> None:
    """Our commands answer ``--help`` with their arguments as shown (imports and argument names are right);
    printing a profile's command runs as shown."""
    words = shlex.split(cmd)
    runs_as_shown = words[:3] == ["python", "-m", "flows.profile"] and "--run" not in words and "--apply" not in words
    if words[0] in SCRIPTS:
        argv = [str(Path(sys.executable).with_name(words[0])), *words[1:], "--help"]
    else:
        argv = [sys.executable, *(words[1:] if runs_as_shown else [*words[1:], "--help"])]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"`{cmd}`: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    if runs_as_shown:
        assert proc.stdout.startswith("dvc exp run") and "-S" in proc.stdout
