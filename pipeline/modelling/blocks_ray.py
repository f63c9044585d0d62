"""The corpus half of tokenize on Ray (``tokenize.engine: ray``): one Ray task per shard, the same files byte for byte.

Each task loads the stage's tokenizer from its folder and runs :func:`pipeline.modelling.blocks.write_shard`, the
local engine's own function, on its run of corpus row groups, writing its shard straight into the stage's output
folder: every node must see the corpus and that folder (a shared filesystem, as for ``ingest.engine: ray``'s
sources). Tasks are independent (a block never spans two shards), so the cluster's CPUs pack in parallel and the
driver only collects the manifest lines. Ray is imported here only, and only when this engine is chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.console import Progress
from pipeline.modelling.shards import ShardJob, ShardRecord
from pipeline.text.ray_cluster import data_error_in, ray_cluster

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.ray import RayConfig
    from pipeline.core.sections.tokenize import TokenizeConfig

# A task is one CPU: the Rust tokenizer's own thread pool would otherwise start one thread per core in every task.
TASK_ENV = {"RAYON_NUM_THREADS": "1"}


def pack_shard_task(
    tok_dir: str, corpus_dir: str, job: ShardJob, out_root: str, tc: TokenizeConfig, seed: int
) -> tuple[ShardRecord, dict[str, Any]]:
    """One shard in a Ray worker: the tokenizer from its folder, then the local engine's :func:`write_shard`."""
    from transformers import AutoTokenizer

    from pipeline.modelling.blocks import write_shard

    tok = AutoTokenizer.from_pretrained(tok_dir)
    return write_shard(tok, Path(corpus_dir), job, Path(out_root), tc, seed)


def write_shards_on_ray(
    tok_dir: Path, corpus_dir: Path, jobs: list[ShardJob], out_root: Path, tc: TokenizeConfig, rc: RayConfig, seed: int
) -> tuple[list[tuple[ShardRecord, dict[str, Any]]], dict[str, Any]]:
    """Every job as a Ray task on the cluster ``rc`` names; their results in job order, and the cluster joined."""
    import ray

    progress = Progress("tokenize: shards (ray)", len(jobs), "shards")
    try:
        with ray_cluster(rc) as cluster:
            task = ray.remote(num_cpus=1, max_retries=0, runtime_env={"env_vars": TASK_ENV})(pack_shard_task)
            refs = [
                task.remote(str(tok_dir.resolve()), str(corpus_dir.resolve()), job, str(out_root.resolve()), tc, seed)
                for job in jobs
            ]
            pending, done = list(refs), 0
            while pending:  # progress as shards finish, in any order
                finished, pending = ray.wait(pending, num_returns=1)
                done += len(finished)
                progress.update(done)
            results = ray.get(refs)
    except Exception as exc:
        err = data_error_in(exc)
        if err is None or err is exc:
            raise
        raise err from None  # bad input named by file and rule, as the local engine names it
    finally:
        progress.close()
    return results, cluster
