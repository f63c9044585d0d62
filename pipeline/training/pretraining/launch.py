"""``pretrain.nproc`` processes: the stage re-run under ``torchrun`` (gloo on a CPU, NCCL on a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

from pipeline.core.errors import ConfigError, WorkersFailed
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.tracking.runs import worker_env


def launch_distributed(pc: PretrainConfig, argv: list[str]) -> None:
    """Re-run ``python -m pipeline <argv>`` (the pretrain stage's command line) under ``torchrun`` with ``pc.nproc``
    processes (gloo on CPU, NCCL on GPU)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={pc.nproc}",
        "-m",
        "pipeline",
        *argv,
    ]
    if "pretrain" not in argv:
        raise ConfigError("pretrain.nproc > 1 is launched from the CLI: python -m pipeline pretrain")
    proc = subprocess.run(
        cmd, check=False, env={**os.environ, **worker_env()}
    )  # rank 0 logs into the stage's MLflow run
    if proc.returncode:
        raise WorkersFailed(f"torchrun: {' '.join(cmd)} exited with {proc.returncode}")
