"""docs/errors.md lists every error class with its exit code and whether the Prefect flow retries it; this checks the
table against the code: the classes, their codes, and the flow's retry rule (exactly exit 4 is retried)."""

from __future__ import annotations

import errno
import inspect
import re

import pytest

from pipeline.core import errors
from tests.conftest import ROOT

HEADER = "| error | exit | retried | when |"


def error_table() -> dict[str, tuple[str, str]]:
    """``{class name: (exit cell, retried cell)}`` of the table in docs/errors.md (a row may name two classes)."""
    lines = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2
    rows: dict[str, tuple[str, str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first, code, retried = (cell.strip() for cell in line.strip("|").split("|")[:3])
        for name in re.findall(r"`(\w+)`", first.split("(")[0]):
            rows[name] = (code, retried)
    return rows


def retried_by_the_flow(code: int) -> bool:
    """Whether the Prefect flow retries a stage that exited with ``code`` (its real retry condition)."""
    from prefect.states import Failed

    from flows.pipeline import retry_transient_only
    from flows.stages import classify_failure

    failure = classify_failure("ingest", f"ERROR: failed to run: python -m pipeline ingest, exited with {code}")
    return retry_transient_only(None, None, Failed(data=failure))


def test_every_error_class_is_in_the_table_with_its_exit_code_and_retry() -> None:
    table = error_table()
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.Failure)]
    assert len(classes) >= 9
    for cls in classes:
        if cls is errors.Failure:
            continue
        assert cls.__name__ in table, f"docs/errors.md has no row for {cls.__name__}"
        code, retried = table[cls.__name__]
        assert code == str(cls.exit_code), f"{cls.__name__}: the table says exit {code}, the class {cls.exit_code}"
        assert retried == ("yes" if retried_by_the_flow(cls.exit_code) else "no"), cls.__name__


@pytest.mark.parametrize(
    ("name", "err"),
    [
        ("OSError", OSError(errno.ENOSPC, "No space left on device", "data/corpus")),
        ("MemoryError", MemoryError()),
        ("KeyboardInterrupt", KeyboardInterrupt()),
        ("Terminated", errors.Terminated()),
    ],
)
def test_the_rows_for_exceptions_that_are_not_ours_match_the_boundary(name: str, err: BaseException) -> None:
    code, retried = error_table()[name]
    exit_code, _ = errors.classify(err)
    assert str(exit_code) in code.split(" / ")
    assert retried == ("yes" if retried_by_the_flow(exit_code) else "no")


def test_exactly_the_transient_exit_code_is_retried() -> None:
    retried = [code for code in (1, 2, 3, 4, 130, 143) if retried_by_the_flow(code)]
    assert retried == [errors.EXIT_ENVIRONMENT]
