"""The Ray cluster the engines run on (``ingest.engine`` or ``tokenize.engine: ray``): joined or started for a stage,
Ray Data configured, and a task's :class:`~pipeline.core.errors.DataError` unwrapped. Ray is imported inside the
functions only: importing this module costs nothing."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import ClusterUnavailable, DataError

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ray import RayConfig


@contextmanager
def ray_cluster(rc: RayConfig) -> Iterator[dict[str, Any]]:
    """Join ``ray.address`` (or ``RAY_ADDRESS``: a Prefect Ray task runner's cluster), or start a local Ray for the
    block (stopped after it); an already connected one is used. Yields what was joined: ``{"joined": bool, "cpus"}``."""
    import ray

    if ray.is_initialized():
        configure_data_context()
        yield {"joined": True, "cpus": int(ray.cluster_resources().get("CPU", 0))}
        return
    address = rc.address or os.environ.get("RAY_ADDRESS", "")
    source = "ray.address" if rc.address else "RAY_ADDRESS"  # the setting a message names
    local = not address
    check_reachable(address, source)
    try:
        ray.init(
            address=rc.address or None,
            num_cpus=rc.num_cpus if local else None,
            object_store_memory=rc.object_store_mb * 2**20 if local and rc.object_store_mb else None,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    except ConnectionError as err:  # `auto` (or a GCS address) with no cluster behind it: ours to name, exit 4
        raise ClusterUnavailable(
            f"{source}: no Ray cluster to join at '{address}' ({str(err).split('.')[0]}); start one (`ray start "
            "--head`), fix the address, or leave it empty for a local Ray"
        ) from None
    try:
        configure_data_context()
        yield {"joined": not local, "cpus": int(ray.cluster_resources().get("CPU", 0))}
    finally:
        ray.shutdown()


def check_reachable(address: str, source: str = "ray.address", seconds: float = 5.0) -> None:
    """Fail within ``seconds`` when ``address`` (``host:port`` or ``ray://host:port``, from the setting ``source``)
    takes no connection; ``ray.init`` would wait minutes. Empty and ``auto`` are Ray's to resolve."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not address or address == "auto" or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
        return
    except OSError as err:
        why = err.strerror or type(err).__name__
    # raised outside the handler: the CLI's boundary reads an OSError in the chain as a local disk/OS problem
    raise ClusterUnavailable(
        f"{source}: no Ray cluster answers at {address} ({why}); start one (`ray start --head`), "
        "fix the address, or leave it empty for a local Ray"
    )


def configure_data_context() -> None:
    """Ray Data without progress bars, its group-bys as sort-based shuffles.

    The sort-based shuffle over tasks ran this module's group-bys 2x faster than the default hash shuffle (whose
    aggregator actors cost seconds to start) on 0.1 GB and 2 cores (``python -m benchmarks.scale``).
    """
    from ray.data import DataContext
    from ray.data.context import ShuffleStrategy

    logging.getLogger("ray.data").setLevel(logging.WARNING)  # not a line per dataset executed
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED


def data_error_in(exc: BaseException) -> DataError | None:
    """The :class:`DataError` a Ray task raised, from the exceptions Ray wraps it in (or ``None``)."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, DataError):
            return e
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None
