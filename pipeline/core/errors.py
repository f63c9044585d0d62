"""How stages fail, and the one place that turns any failure into a message and an exit code.

Exit codes (the README's "When the data is bad" lists them with the recovery for each):
0 success; 1 the stage ran and failed (NaN loss, a refused registry request, an internal bug);
2 the configuration is invalid; 3 bad or missing input data; 4 environment or infrastructure
(disk full, permission denied, read-only file system, out of memory, tracking store down);
130 interrupted (Ctrl-C), 143 terminated (SIGTERM). Each of the project's error classes carries
its exit code (``exit_code``), so the CLI's boundary and the Prefect flow's retry rule (exit 4 is
retried, 2 and 3 never) read it from the class.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, ClassVar

EXIT_FAILED, EXIT_CONFIG, EXIT_DATA, EXIT_ENVIRONMENT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 3, 4, 130, 143


class Failure(Exception):
    """Base of the project's errors: the message is the one line the user reads; ``exit_code`` says what kind."""

    exit_code: ClassVar[int] = EXIT_FAILED


class ConfigError(Failure, ValueError):
    """A params file that cannot be used; the message names key path, value and expectation."""

    exit_code = EXIT_CONFIG


class DataError(Failure):
    """Bad input: which file, which line (or row), which rule, and what to do about it."""

    exit_code = EXIT_DATA

    def __init__(self, path: str | Path, line: int | None, rule: str, detail: str) -> None:
        self.path, self.line, self.rule, self.detail = str(path), line, rule, detail
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: [{rule}] {detail}")

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "line": self.line, "rule": self.rule, "detail": self.detail}

    def __reduce__(self) -> tuple[type[DataError], tuple[str, int | None, str, str]]:
        """Pickled with its four fields (the message alone cannot rebuild it): a Ray worker's error reaches the driver."""
        return (type(self), (self.path, self.line, self.rule, self.detail))


class ValidationFailed(Failure):
    """Great Expectations suites failed; the message is the readable summary."""

    exit_code = EXIT_DATA


class NonFiniteLoss(Failure, RuntimeError):
    """Training produced a NaN or infinite loss; the run stops before the next checkpoint."""


class TrackingUnavailable(Failure, RuntimeError):
    """The MLflow tracking store or registry stayed unreachable after the bounded retries; names the URL."""

    exit_code = EXIT_ENVIRONMENT


class ClusterUnavailable(Failure, RuntimeError):
    """The Ray cluster ``ray.address`` names does not answer; names the address (Ray itself would retry for minutes)."""

    exit_code = EXIT_ENVIRONMENT


class RegistryError(Failure, RuntimeError):
    """A registry request that cannot be done (unknown version, nothing to roll back to, gate refused)."""


class WorkersFailed(Failure, RuntimeError):
    """Worker processes this stage launched (``torchrun``) failed: environment (a killed worker, a port in use,
    memory), so the flow retries it; the workers' own error lines are above it in the log."""

    exit_code = EXIT_ENVIRONMENT


class SourceUnavailable(DataError):
    """A configured source cannot be reached (the Hugging Face Hub offline): environment, exit code 4."""

    exit_code = EXIT_ENVIRONMENT


class MissingInput(DataError):
    """A stage input that an earlier stage writes is missing or unreadable; names the stage to run (made by
    :func:`pipeline.core.io.missing_input`, which finds it in the stage table)."""

    def __init__(self, path: str | Path, detail: str, producer: str | None) -> None:
        todo = stage_command(producer) if producer else "the stage that writes it"
        super().__init__(path, None, "missing-input", f"{detail}; run {todo} first")


def stage_command(stage: str) -> str:
    """How a person runs one stage, as messages say it."""
    return f"`dvc repro {stage}` (or `python -m pipeline {stage}`)"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that ``finally`` blocks and staged outputs are cleaned up."""


_stop_signal: int | None = None  # the SIGINT/SIGTERM this process received, if any


def raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` (and SIGINT into ``KeyboardInterrupt``, as by default) in this
    process, remembering the signal: an exception raised while Python runs a callback (a weakref's, an import
    lock's) is printed and dropped, so :func:`raise_if_stopped` raises it again before outputs are committed."""
    global _stop_signal
    _stop_signal = None

    def handler(signum: int, frame: Any) -> None:
        global _stop_signal
        _stop_signal = signum
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def raise_if_stopped() -> None:
    """Raise the stop a signal asked for, if one came (its first exception may have been swallowed)."""
    if _stop_signal == signal.SIGTERM:
        raise Terminated()
    if _stop_signal == signal.SIGINT:
        raise KeyboardInterrupt()


def exit_at_next_stop(code: int) -> None:
    """After a stop was handled (outputs cleaned up, the message printed): a further SIGINT/SIGTERM while Python
    shuts down (a second Ctrl-C, or one delivered twice) ends the process at once with ``code``, rather than as a
    KeyboardInterrupt that escapes ``main`` (Python then dies of SIGINT: exit -2, not 130) or a traceback."""

    def handler(signum: int, frame: Any) -> None:
        sys.stderr.flush()
        os._exit(code)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


_OS_REASONS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EMFILE: "too many open files",
    errno.ENOMEM: "out of memory",
    errno.EIO: "input/output error",
    errno.EPIPE: "output closed",
}


def describe_os_error(err: OSError) -> str:
    """``<path>: [<reason>] <strerror>`` for an OSError, naming the file where the OS gave one."""
    reason = _OS_REASONS.get(err.errno or -1, "operating system error")
    if err.filename is None:  # stages name their outputs (pipeline.core.io.transaction); a library may not
        return f"[{reason}] {err.strerror or err} (the library that failed did not name the file)"
    where = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
    return f"{where}: [{reason}] {err.strerror or err}"


# Libraries that report an OS error only as text. Rust ones (safetensors, tokenizers): "Error while serializing: I/O
# error: No space left on device (os error 28)". PyTorch's zip writer (torch.save: optimizer.pt) on a full disk:
# "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534" (or "PytorchStreamWriter failed writing").
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_TORCH_WRITER = re.compile(r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing")


def error_chain(err: BaseException | None, limit: int = 10) -> list[BaseException]:
    """``err`` and what it was raised from or during (``__cause__``/``__context__``), outermost first."""
    chain: list[BaseException] = []
    while err is not None and len(chain) < limit:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def os_error_in_text(err: BaseException) -> OSError | None:
    """The OS error a library put only in its message (see ``_RUST_OS_ERROR``), as an ``OSError``."""
    text = str(err)
    if match := _RUST_OS_ERROR.search(text):
        code = int(match.group(1))
        return OSError(code, os.strerror(code))
    if _TORCH_WRITER.search(text):
        return OSError(errno.EIO, "PyTorch's file writer stopped part-way (a full disk is the usual cause)")
    return None


def find_os_error(err: BaseException) -> OSError | None:
    """The OSError at the root of ``err`` (libraries wrap them: PyArrow, sqlite), or one a library reported only
    as text (safetensors, ``torch.save``; then a new ``OSError``, not part of the chain)."""
    chain = error_chain(err)
    for link in chain:
        if isinstance(link, OSError) and link.errno is not None:
            return link
    return next((found for link in chain if (found := os_error_in_text(link)) is not None), None)


def classify(err: BaseException) -> tuple[int, str]:
    """The exit code and one-line message for ``err`` (empty for an unexpected error: a bug)."""
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
    if isinstance(err, Failure):
        return err.exit_code, str(err)
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
        path.write_text(redact_secrets("".join(traceback.format_exception(err))), encoding="utf-8")
    except OSError:
        return None
    return path


def show_tracebacks() -> bool:
    """``ADAPTBERT_TRACEBACK=1`` re-raises unexpected errors (for debugging adaptbert itself)."""
    return os.environ.get("ADAPTBERT_TRACEBACK", "") not in ("", "0")


def closest(word: str, choices: Any) -> str | None:
    """The choice a mistyped ``word`` most likely meant (a similarity ratio of 0.6 or more), if any: the "did you
    mean" of a key, a command or a section."""
    import difflib

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def shorten(items: Any, limit: int = 10) -> str:
    """A list for a message: its first ``limit`` items and how many more (a label set can be thousands long)."""
    items = list(items)
    shown = ", ".join(repr(x) if not isinstance(x, str) else f"'{x}'"[:80] for x in items[:limit])
    return f"[{shown}{f', ... and {len(items) - limit} more' if len(items) > limit else ''}]"


# ----------------------------------------------------------------------------- secrets out of what we show

# ``MLFLOW_TRACKING_URI=http://alice:pw@host`` is how a user reaches a server behind basic auth; the URI reaches our
# error messages, ``reports/promotion.json`` and the run report's links. Each shows ``redact_secrets`` of it: the
# password and user name go, the host stays (a link still works: the browser asks for the login).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s'\"]+@")
_SECRET_QUERY = re.compile(
    r"(?P<key>[?&;][^=&#\s'\"]*(?:token|key|secret|passw|pwd|sig|auth|credential)[^=&#\s'\"]*)=[^&;#\s'\"]+",
    re.IGNORECASE,
)


def redact_secrets(text: str) -> str:
    """``text`` with every URI's user info removed and the values of token-like query parameters replaced by ***."""
    return _SECRET_QUERY.sub(r"\g<key>=***", _USERINFO.sub(r"\g<scheme>", text))
