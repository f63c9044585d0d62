"""The flow's work without Prefect: run one DVC stage, apply overrides, turn reports into artifacts.

Kept free of Prefect so it can be tested directly; :mod:`flows.pipeline` wraps these functions
in tasks. DVC stays the single owner of caching, outputs and ``dvc.lock``: every stage runs as
``dvc repro --single-item <stage>``, and DVC decides whether it runs or is skipped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.config import load_config, set_dotted
from pipeline.core.errors import EXIT_DATA, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_TERMINATED
from pipeline.tracking.runs import file_lock


class StageFailed(RuntimeError):
    """A stage exited non-zero (or timed out); the message ends with the stage's own error lines."""

    def __init__(self, stage: str, detail: str, exit_code: int | None = None) -> None:
        self.stage, self.detail, self.exit_code = stage, detail, exit_code
        super().__init__(f"stage '{stage}' failed: {detail}")

    def __reduce__(self) -> tuple[type[StageFailed], tuple[str, str, int | None]]:
        """Pickled with its fields: a stage run as a Ray task (``stage_on_ray``) fails on the driver with this error."""
        return (type(self), (self.stage, self.detail, self.exit_code))


class TransientStageFailure(StageFailed):
    """Exit code 4 (environment: tracking store down, database locked, disk full): a retry may cure it."""


class ValidationStageFailure(StageFailed):
    """Exit code 3 (bad data): validation rejected it or a reader did. Never retried."""


class InterruptedStageFailure(StageFailed):
    """Exit code 130/143: the stage was interrupted (Ctrl-C, SIGTERM). Never retried."""


_EXIT_CODE = re.compile(r"exited with (-?\d+)")  # DVC's "failed to run: <cmd>, exited with N"
FAILURES_BY_EXIT_CODE: dict[int, type[StageFailed]] = {
    EXIT_DATA: ValidationStageFailure,
    EXIT_ENVIRONMENT: TransientStageFailure,
    EXIT_INTERRUPTED: InterruptedStageFailure,
    EXIT_TERMINATED: InterruptedStageFailure,
}


def stage_exit_code(output: str) -> int | None:
    """The stage command's exit code, as DVC reports it (``None`` when DVC itself failed)."""
    codes = _EXIT_CODE.findall(output)
    return int(codes[-1]) if codes else None


def classify_failure(stage: str, output: str) -> StageFailed:
    """The exception for a failed stage, by the stage's exit code (``pipeline.core.errors``): 3 data, 4 transient, 130/143 interrupted."""
    tail = "\n".join(line for line in output.strip().splitlines()[-15:] if line.strip())
    code = stage_exit_code(output)
    return (
        FAILURES_BY_EXIT_CODE.get(code, StageFailed)(stage, tail, code)
        if code is not None
        else StageFailed(stage, tail)
    )


@contextmanager
def repo_lock(root: Path) -> Iterator[None]:
    """One pipeline run at a time per repository (DVC allows one process per repo)."""
    with file_lock(root / ".adaptbert" / "flow.lock"):
        yield


def run_dvc_stage(
    root: Path, stage: str, force: bool, timeout_s: int, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """``dvc repro -s [-f] <stage>`` in ``root``; whether DVC ran it, how long it took, its output.

    The process group is killed at ``timeout_s``; a non-zero exit raises the matching
    :class:`StageFailed` subclass.
    """
    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.exists() else "dvc", "repro", "--single-item", *(["--force"] if force else []), stage]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=root,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise StageFailed(stage, f"timed out after {timeout_s} s (schedule.timeout_s)") from None
    seconds = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        raise classify_failure(stage, output)
    return {"stage": stage, "ran": f"Running stage '{stage}'" in output, "seconds": seconds, "output": output[-4000:]}


# ----------------------------------------------------------------------------- overrides


def params_backup(root: Path) -> Path:
    return root / ".adaptbert" / "params.yaml.before-run"


def restore_interrupted_run(root: Path) -> bool:
    """Put back the ``params.yaml`` of a run that was killed with its overrides applied; True if there was one."""
    backup = params_backup(root)
    if not backup.exists():
        return False
    (root / "params.yaml").write_bytes(backup.read_bytes())
    backup.unlink()
    return True


@contextmanager
def overridden_params(root: Path, overrides: dict[str, Any]) -> Iterator[None]:
    """``params.yaml`` with ``overrides`` applied for the duration of a run, then restored byte for byte.

    The overrides are validated first (a bad key fails before anything runs) and written the way
    ``dvc exp run -S`` writes them (DVC's round-trip YAML: comments kept). The user's file is kept
    in ``.adaptbert/params.yaml.before-run`` while the run lasts and comes back whatever happens;
    if the process is killed, the next run restores it before doing anything else.
    """
    params = root / "params.yaml"
    restore_interrupted_run(root)
    if not overrides:
        yield
        return
    load_config(params, overrides)  # raises ConfigError naming the key
    from dvc.utils.serialize import modify_yaml

    backup = params_backup(root)
    backup.parent.mkdir(parents=True, exist_ok=True)
    backup.write_bytes(params.read_bytes())
    try:
        with modify_yaml(params) as data:
            for dotted, value in overrides.items():
                set_dotted(data, dotted, value)
        yield
    finally:
        restore_interrupted_run(root)
