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


# Runs a command's own entry point with argparse stopped right after a successful parse: the arguments as shown are
# checked (an unknown flag is exit 2), nothing runs. (Appending --help, as before, exits 0 before argparse reports
# the unknown flags before it.)
PARSE_ONLY = """
import argparse, runpy, sys

parse = argparse.ArgumentParser.parse_args


def parsed_then_stop(self, args=None, namespace=None):
    parse(self, args, namespace)
    print("adaptbert-test: arguments parsed", flush=True)
    raise SystemExit(0)


argparse.ArgumentParser.parse_args = parsed_then_stop
target, argv = sys.argv[1], sys.argv[2:]
if ":" in target:  # a console script: module:function
    module, function = target.split(":")
    sys.argv = [module, *argv]
    getattr(__import__(module, fromlist=[function]), function)()
else:
    sys.argv = [target, *argv]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
"""
ENTRY_POINTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("cmd", CHEAP)
def test_the_cheap_commands_run(cmd: str) -> None:
    """Our commands take their arguments as shown (imports and argument names are right); printing a profile's
    command runs as shown."""
    words = shlex.split(cmd)
    runs_as_shown = words[:3] == ["python", "-m", "flows.profile"] and "--run" not in words and "--apply" not in words
    if runs_as_shown:
        argv = [sys.executable, *words[1:]]
    elif words[0] in SCRIPTS:
        argv = [sys.executable, "-c", PARSE_ONLY, ENTRY_POINTS[words[0]], *words[1:]]
    else:
        argv = [sys.executable, "-c", PARSE_ONLY, words[2], *words[3:]]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"`{cmd}`: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    if not runs_as_shown:
        assert "adaptbert-test: arguments parsed" in proc.stdout, f"`{cmd}`: {proc.stdout[-500:]}"
    if runs_as_shown:
        assert proc.stdout.startswith("dvc exp run") and "-S" in proc.stdout
