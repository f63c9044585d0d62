"""params.yaml ``ray``: where the Ray engine runs (``ingest.engine: ray``)."""

from __future__ import annotations

from pydantic import Field

from pipeline.core.sections.base import Strict


class RayConfig(Strict):
    """A Ray cluster to join, or a local one to start for the stage's run."""

    address: str = ""  # empty: start a local Ray on this machine for the run; "host:6379" or "auto": join that cluster
    num_cpus: int | None = Field(default=None, ge=1)  # a local Ray's CPUs (null: all of this machine's)
    object_store_mb: int | None = Field(default=None, ge=64)  # a local Ray's shared memory (null: Ray's 30% of RAM)
