"""Training the adapted and the baseline model at the same time on a CPU, each in a process of its own.

A fine-tuning step of MiniLM on 16 short examples is too small to keep two cores busy: on a 2-core AMX
Xeon a bf16 step took 0.153 s with two threads and 0.189 s with one, so two models trained side by side
with one thread each finish a step pair every ~0.20 s instead of every 0.31 s (1.5x; docs/speed.md).
:func:`side_by_side_threads` is the pure rule (when, and how many threads each process gets);
:func:`train_side_by_side` starts one ``spawn`` process per model, each training with
:func:`pipeline.training.contenders.train_contender` exactly as the sequential path does (its own checkpoints,
resume, curves and nested MLflow run) and saving its best model to a folder the parent loads back. The first
child that fails stops the other, and its error is raised here (a :class:`DataError` as itself).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Literal

from pipeline.core.config import Config
from pipeline.core.errors import Failure, WorkersFailed, raise_on_sigterm
from pipeline.core.paths import Paths
from pipeline.modelling.precision import Precision
from pipeline.tracking.runs import child_tracking_env

EXIT_GRACE_S = 60  # seconds a child that sent its result gets to exit before it is terminated


def side_by_side_threads(
    mode: Literal["auto", "always", "never"], device: str, models: int, sequential: bool, threads: int
) -> int | None:
    """Threads per process when ``models`` train side by side, or ``None`` for one after the other: ``auto`` on a
    CPU with two models, at least two threads and no model waiting for another's result (``sequential``: the
    baseline's same-compute budget needs the adapted run's speed); ``always`` wherever two models train on a CPU."""
    if mode == "never" or device != "cpu" or models != 2 or sequential:
        return None
    if mode == "auto" and threads < 2:
        return None
    return max(1, threads // models)


def torch_threads() -> int:
    """The intra-op threads torch uses in this process (``OMP_NUM_THREADS``, else the cores)."""
    import torch

    return int(torch.get_num_threads())


def train_side_by_side(
    configs: dict[str, Config], paths: Paths, precision: Precision, threads: int
) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Train the contenders named by ``configs`` (adapted, baseline; each with its own settings: params.yaml or the
    search's choice) at once, ``threads`` each; their best models (loaded back) and training summaries, by name."""
    import multiprocessing

    from pipeline.training.multitask import load_multitask

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no OpenMP pool or MLflow store across a fork
    work = paths.root / ".adaptbert"  # git-ignored, outside every DVC output
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix="finetune-side-by-side-") as tmp:
        env = child_tracking_env()
        children: dict[Connection, tuple[str, Any, Path]] = {}
        delivered = False
        try:
            for name, cfg in configs.items():
                reader, writer = ctx.Pipe(duplex=False)
                out = Path(tmp) / name
                proc = ctx.Process(
                    target=train_child, args=(writer, cfg, paths, name, precision, threads, out, env), name=name
                )
                proc.start()
                writer.close()  # the child holds the only writing end: its death closes the pipe
                children[reader] = (name, proc, out)
            summaries = collect(children)
            delivered = True
        finally:
            for _, proc, _ in children.values():
                # a child that delivered is exiting on its own: a SIGTERM now lands in its clean-up (garbage
                # collection) and printed "Exception ignored in Dataset.__del__ ... Terminated" into the stage's output
                proc.join(timeout=EXIT_GRACE_S if delivered else 0)
                if proc.is_alive():
                    proc.terminate()
                proc.join()
        return {name: (load_multitask(out)[0], summaries[name]) for name, _, out in children.values()}


def collect(children: dict[Connection, tuple[str, Any, Path]]) -> dict[str, dict[str, Any]]:
    """Each child's summary as it arrives; the first error (or a child that died without a word) is raised."""
    summaries: dict[str, dict[str, Any]] = {}
    pending = list(children)
    while pending:
        for reader in wait(pending):
            name, proc, _ = children[reader]  # type: ignore[index]
            pending.remove(reader)  # type: ignore[arg-type]
            try:
                kind, payload = reader.recv()  # type: ignore[union-attr]
            except EOFError:
                proc.join()
                raise WorkersFailed(  # killed, out of memory: the environment (exit 4), as a dead torchrun worker
                    f"the process training the {name} model ended without a result (exit code {proc.exitcode}); "
                    "its checkpoints are kept, so the next run resumes it"
                ) from None
            if kind == "error":
                raise payload
            summaries[name] = payload
    return summaries


def train_child(
    conn: Connection,
    cfg: Config,
    paths: Paths,
    name: str,
    precision: Precision,
    threads: int,
    out: Path,
    env: dict[str, str],
) -> None:
    """Child process: train contender ``name`` with ``cfg`` and ``threads`` threads, save its best model to ``out``,
    send its summary (or its error) to the parent."""
    os.environ.update(env)
    raise_on_sigterm()  # stopped by the parent (the other model failed): end this model's MLflow run FAILED, not RUNNING
    try:
        from pipeline.core.console import quiet_libraries

        quiet_libraries()  # as the stage process does: a spawned interpreter starts with the libraries' defaults
        import torch

        from pipeline.training.contenders import (
            adapted_contender,
            baseline_contender,
            finetune_place,
            train_contender,
        )
        from pipeline.training.data import load_tasks
        from pipeline.training.multitask import save_multitask

        torch.set_num_threads(threads)
        if env:
            import mlflow  # noqa: F401 (nested_run finds it imported and logs the model's run into the stage run)
        contender = adapted_contender(paths) if name == "adapted" else baseline_contender(cfg, paths)
        tasks = load_tasks(cfg, paths, contender.tokenized)
        place = dataclasses.replace(finetune_place(paths, contender), stage=f"finetune {name}")  # whose lines these are
        model, summary = train_contender(cfg, paths, contender, tasks, precision, place=place)
        save_multitask(model, contender.tokenizer, out, "")
        conn.send(("summary", summary))
    except BaseException as err:
        with contextlib.suppress(OSError):  # a parent that stopped this process may no longer read
            conn.send(("error", portable(err)))
    finally:
        conn.close()


def portable(err: BaseException) -> BaseException:
    """What the parent raises for ``err``: our errors and interrupts as themselves (a DataError keeps its file, line
    and rule), anything else as a RuntimeError carrying the child's traceback."""
    import pickle

    from pipeline.core.errors import DataError

    if isinstance(err, DataError):
        return DataError(err.path, err.line, err.rule, err.detail)  # subclasses' own __init__ may not unpickle
    if isinstance(err, Failure | KeyboardInterrupt):
        try:
            return pickle.loads(pickle.dumps(err))
        except Exception:
            return RuntimeError(str(err))
    text = "".join(traceback.format_exception(err)).strip()
    return RuntimeError(f"training failed in its own process:\n{text}")
