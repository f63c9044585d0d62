"""The registry lock that serialises promotions across processes and machines, and the registered model's creation
(both safe when two processes race; MLflow's REST API has no compare-and-set, so creating a name is the mutex)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

from pipeline.core.errors import RegistryError


def ensure_registered_model(client: Any, name: str) -> None:
    """Create ``name`` in the registry unless it exists (safe when two processes race)."""
    try:
        client.create_registered_model(name, description="adaptbert multi-task model (pyfunc: every task type)")
    except Exception as err:  # a racing insert is SQLAlchemy's IntegrityError, not an MlflowException
        if not already_exists(err):
            raise


LOCK_SUFFIX = ".promotion-lock"  # the registered model that is the lock of <name>'s promotions
LOCK_STALE_S = 600  # a lock older than this was left by a process that died holding it: taken over


def already_exists(err: Exception) -> bool:
    """The error for a name the registry holds already: MLflow's (SQLite, PostgreSQL, a server), or the store's unique
    key itself where two processes passed MLflow's read-then-insert at once (SQLite's "UNIQUE constraint failed",
    PostgreSQL's "duplicate key value", raised as SQLAlchemy's IntegrityError: seen in CI with three threads)."""
    text = str(err).lower()
    return (
        getattr(err, "error_code", "") == "RESOURCE_ALREADY_EXISTS"
        or "already exists" in text
        or "unique constraint failed" in text
        or "duplicate key value" in text
    )


@contextlib.contextmanager
def promotion_lock(client: Any, name: str, wait_s: float = 300) -> Iterator[None]:
    """Serialise promotions of ``name`` across processes and machines: the lock is a registered model
    ``<name>.promotion-lock``, which only one process can create (the store's unique model names: SQLite,
    PostgreSQL, any server), deleted when the promotion ends. A file lock serialised one machine only: two machines
    registering at once against a team's server both moved ``champion`` (tests/e2e/test_team_stack.py). MLflow's
    REST API has no compare-and-set, so its one atomic write, creating a name, is the mutex. A lock older than
    :data:`LOCK_STALE_S` (its holder died) is taken over; waiting longer than ``wait_s`` is a RegistryError."""
    from mlflow.exceptions import MlflowException

    lock = f"{name}{LOCK_SUFFIX}"
    owner = f"{socket.gethostname()}:{os.getpid()}"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.create_registered_model(
                lock,
                tags={"adaptbert.lock.owner": owner, "adaptbert.lock.since": f"{time.time():.0f}"},
                description=f"held by {owner} while it promotes a version of {name} (adaptbert); deleted after",
            )
            break
        except Exception as err:  # a racing insert is SQLAlchemy's IntegrityError (see already_exists)
            if not already_exists(err):
                raise
        held = lock_holder(client, lock)
        if held is not None and time.time() - held[1] > LOCK_STALE_S:
            with contextlib.suppress(MlflowException):
                client.delete_registered_model(lock)
            continue
        if time.monotonic() > deadline:
            who = f" by {held[0]}" if held else ""
            raise RegistryError(
                f"another promotion of '{name}' has held the registry lock '{lock}'{who} for over {wait_s:.0f} s; "
                f"try again, or delete that registered model if no promotion is running"
            )
        time.sleep(0.2 + random.random() * 0.3)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            client.delete_registered_model(lock)


def point_alias(client: Any, name: str, alias: str, version: str) -> None:
    """Move ``alias`` of ``name`` to ``version`` under the registry lock: MLflow's SQL store sets an alias by a read
    then an insert, so two processes setting one alias at once fail on PostgreSQL's unique key (a UniqueViolation
    that ended a register in tests/e2e/test_team_stack.py)."""
    with promotion_lock(client, name):
        client.set_registered_model_alias(name, alias, version)


def lock_holder(client: Any, lock: str) -> tuple[str, float] | None:
    """(owner, since) of the lock model, or None where it is gone (released meanwhile)."""
    from mlflow.exceptions import MlflowException

    try:
        tags = client.get_registered_model(lock).tags
    except MlflowException:
        return None
    return tags.get("adaptbert.lock.owner", "?"), float(tags.get("adaptbert.lock.since", "0") or 0)
