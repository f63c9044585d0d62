"""How stages fail, and the one place that turns any failure into a message and an exit code.

Exit codes (the README's "When the data is bad" lists them with the recovery for each):
0 success; 1 the stage ran and failed (NaN loss, a refused registry request, an internal bug);
2 the configuration is invalid; 3 bad or missing input data; 4 environment or infrastructure
(disk full, permission denied, read-only file system, out of memory, tracking store down);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM). Config errors live in config.py.
"""

from __future__ import annotations

import errno
import os
import signal
import traceback
from pathlib import Path
from typing import Any

EXIT_FAILED, EXIT_CONFIG, EXIT_DATA, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 3, 4, 130, 143


class DataError(Exception):
    """Bad input: which file, which line (or row), which rule, and what to do about it."""

    def __init__(self, path: str | Path, line: int | None, rule: str, detail: str) -> None:
        self.path, self.line, self.rule, self.detail = str(path), line, rule, detail
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: [{rule}] {detail}")

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "line": self.line, "rule": self.rule, "detail": self.detail}


class ValidationFailed(Exception):
    """Great Expectations suites failed; the message is the readable summary."""


class NonFiniteLoss(RuntimeError):
    """Training produced a NaN or infinite loss; the run stops before the next checkpoint."""


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking store or registry stayed unreachable after the bounded retries; names the URL."""


class RegistryError(RuntimeError):
    """A registry request that cannot be done (unknown version, nothing to roll back to, gate refused)."""


class SourceUnavailable(DataError):
    """A configured source cannot be reached (the Hugging Face Hub offline): environment, exit code 4."""


class MissingInput(DataError):
    """A stage input that an earlier stage writes is missing or unreadable; names the stage to run."""

    def __init__(self, path: str | Path, detail: str, producer: str) -> None:
        super().__init__(
            path,
            None,
            "missing-input",
            f"{detail}; run `dvc repro {producer}` (or `python -m pipeline {producer}`) first",
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that ``finally`` blocks and staged outputs are cleaned up."""


def raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` in this process (the main thread's handler)."""

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


_OS_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EMFILE: "too many open files",
    errno.ENOMEM: "out of memory",
}


def describe_os_error(err: OSError) -> str:
    """``<path>: <reason> (<strerror>)`` for an OSError, naming the file where the OS gave one."""
    where = err.filename if err.filename is not None else "(no path given)"
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    reason = _OS_REASONS.get(err.errno or -1, "operating system error")
    return f"{where}: [{reason}] {err.strerror or err}"


def find_os_error(err: BaseException) -> OSError | None:
    """The OSError at the root of ``err`` (libraries wrap them: PyArrow, safetensors, sqlite)."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
        seen += 1
    return None


def classify(err: BaseException, known: dict[type[BaseException], int]) -> tuple[int, str]:
    """The exit code and one-line message for ``err``; ``known`` maps the project's own error types to codes."""
    if isinstance(err, Terminated):
        return (
            EXIT_TERMINATED,
            "terminated (SIGTERM): the last good outputs are untouched; run the stage again to resume",
        )
    if isinstance(err, KeyboardInterrupt):
        return (
            EXIT_INTERRUPTED,
            "interrupted (Ctrl-C): the last good outputs are untouched; run the stage again to resume",
        )
    for kind, code in known.items():
        if isinstance(err, kind):
            return code, str(err)
    if isinstance(err, MemoryError):
        return (
            EXIT_ENVIRONMENT,
            "out of memory: lower the batch size or the corpus chunk (ingest.chunk_docs, *.batch_size)",
        )
    os_err = find_os_error(err)
    if os_err is not None:
        return EXIT_ENVIRONMENT, describe_os_error(os_err)
    return EXIT_FAILED, ""


def save_traceback(err: BaseException, root: Path, stage: str) -> Path | None:
    """Write the traceback of an unexpected error to ``.adaptbert/logs/<stage>-traceback.txt`` for a bug report."""
    path = root / ".adaptbert" / "logs" / f"{stage}-traceback.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(err)), encoding="utf-8")
    except OSError:
        return None
    return path


def show_tracebacks() -> bool:
    """``ADAPTBERT_TRACEBACK=1`` re-raises unexpected errors (for debugging adaptbert itself)."""
    return os.environ.get("ADAPTBERT_TRACEBACK", "") not in ("", "0")


def shorten(items: Any, limit: int = 10) -> str:
    """A list for a message: its first ``limit`` items and how many more (a label set can be thousands long)."""
    items = list(items)
    shown = ", ".join(repr(x) if not isinstance(x, str) else f"'{x}'"[:80] for x in items[:limit])
    return f"[{shown}{f', ... and {len(items) - limit} more' if len(items) > limit else ''}]"
