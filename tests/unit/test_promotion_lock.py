"""The registry lock that serialises promotions across machines (a registered model only one process can create)."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from pipeline.core.errors import RegistryError
from pipeline.tracking.registry_lock import LOCK_STALE_S, LOCK_SUFFIX, promotion_lock


@pytest.fixture
def client(tmp_path: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _names(client) -> set[str]:
    return {m.name for m in client.search_registered_models()}


def test_one_holder_at_a_time_and_the_lock_is_gone_after(client) -> None:
    spans: list[tuple[float, float]] = []

    def hold() -> None:
        with promotion_lock(client, "m", wait_s=30):
            start = time.monotonic()
            time.sleep(0.4)
            spans.append((start, time.monotonic()))

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert len(spans) == 3 and all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # never overlapping
    assert f"m{LOCK_SUFFIX}" not in _names(client)


def test_a_held_lock_times_out_naming_it_and_a_stale_one_is_taken_over(client) -> None:
    lock = f"m{LOCK_SUFFIX}"
    client.create_registered_model(
        lock, tags={"adaptbert.lock.owner": "host-a:42", "adaptbert.lock.since": f"{time.time():.0f}"}
    )
    with (
        pytest.raises(RegistryError, match=r"'m\.promotion-lock' by host-a:42"),
        promotion_lock(client, "m", wait_s=0.5),
    ):
        pass
    assert lock in _names(client)  # a lock it did not take is not released by it
    client.set_registered_model_tag(lock, "adaptbert.lock.since", f"{time.time() - LOCK_STALE_S - 5:.0f}")
    with promotion_lock(client, "m", wait_s=5):
        assert client.get_registered_model(lock).tags["adaptbert.lock.owner"] != "host-a:42"
    assert lock not in _names(client)


def test_a_racing_insert_that_hits_the_stores_unique_key_waits_for_the_lock(client) -> None:
    """Two processes can both pass MLflow's read-then-insert on SQLite; the loser gets SQLAlchemy's IntegrityError
    (not an MlflowException). It must wait and take the lock after, not end the promotion (seen in CI)."""
    from sqlalchemy.exc import IntegrityError

    calls = {"n": 0}
    create = client.create_registered_model

    def racing_create(name, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            create(name, *args, **kwargs)  # the other process's insert landed first ...
            threading.Timer(0.3, client.delete_registered_model, args=(name,)).start()  # ... and releases soon
            raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed: registered_models.name"))
        return create(name, *args, **kwargs)

    client.create_registered_model = racing_create
    with promotion_lock(client, "m", wait_s=10):
        assert f"m{LOCK_SUFFIX}" in _names(client)
    assert calls["n"] >= 2 and f"m{LOCK_SUFFIX}" not in _names(client)
