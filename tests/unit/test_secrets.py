"""redact_secrets: no password, user name or token of a URI survives; everything else does."""

from __future__ import annotations

import pytest

from pipeline.core.errors import redact_secrets


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://alice:s3cr3t@mlflow.example:5000", "http://mlflow.example:5000"),
        ("store https://tok_abc123@host/path is down", "store https://host/path is down"),
        ("https://host/api?token=abc&run=1", "https://host/api?token=***&run=1"),
        ("https://host/?api_key=k1;x_sig=zz&Password=p#frag", "https://host/?api_key=***;x_sig=***&Password=***#frag"),
        ("sqlite:////home/u/project/mlflow.db", "sqlite:////home/u/project/mlflow.db"),
        ("'http://u:p@h:1/a' and \"http://v:q@h:2\"", "'http://h:1/a' and \"http://h:2\""),
        ("mail alice@example.org about http://h/x?run=1", "mail alice@example.org about http://h/x?run=1"),
    ],
)
def test_user_info_and_token_values_are_removed(text: str, expected: str) -> None:
    assert redact_secrets(text) == expected


def test_redacting_twice_changes_nothing_more() -> None:
    once = redact_secrets("http://a:b@h/?token=t")
    assert redact_secrets(once) == once and "b@" not in once and "=t" not in once


def test_a_store_error_is_named_by_its_own_line_not_a_librarys_preamble() -> None:
    """A read-only sqlite store (checked by hand with a read-only bind mount of mlflow.db: exit 4, one line) failed
    inside SQLAlchemy's autoflush, whose note came first and was all the message said; secrets still go."""
    from pipeline.tracking.runs import first_line

    err = Exception(
        "(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush block)\n"
        "(sqlite3.OperationalError) attempt to write a readonly database at sqlite://u:pw@h/db\n"
        "[SQL: INSERT INTO experiments ...]"
    )
    assert first_line(err) == "(sqlite3.OperationalError) attempt to write a readonly database at sqlite://h/db"
    assert first_line(Exception("(raised as a result of x)")) == "(raised as a result of x)"  # nothing else to say
    assert first_line(Exception("")) == ""
