"""The two ways a stage fails on its data (exit code 1); config errors live in config.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
