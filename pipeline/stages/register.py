"""register stage (the last of eight): log the fine-tuned model as an MLflow pyfunc, register it, run the promotion gate.

1. ``models/finetuned/`` becomes a pyfunc (``pipeline/serving/pyfunc_model.py``) with a
   signature, an input example (one test row per task) and the ``pipeline`` code, so
   ``mlflow models serve`` needs nothing from this checkout. Before registering, the logged
   model is loaded back and must answer its input example: a model that cannot serve is never
   registered.
2. A new version of ``register.model_name``, tagged with lineage (git, ``dvc.lock`` hashes, data
   hash, params hash) and the test metrics; alias ``challenger`` moves to it.
3. The gate (:func:`pipeline.tracking.registry.should_promote`) against the current ``champion``; on pass
   ``champion`` moves (:func:`pipeline.tracking.registry.promote`), on fail it stays.
4. ``reports/promotion.json``: versions, the side-by-side table and the reason, either way.

Any failure before step 2 leaves the registry as it was; the aliases only move in steps 2 and 3.
"""

from __future__ import annotations

import hashlib
import json
import time
from importlib.metadata import version as installed
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.io import read_report, require_inputs, write_json
from pipeline.core.paths import Paths

# What the pyfunc imports when it is served (the ``pipeline`` package travels as code).
SERVING_PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "datasets",
    "pyarrow",
    "pandas",
    "numpy",
    "pydantic",
    "pyyaml",
    "regex",
    "seqeval",
    "scikit-learn",
    "mlflow",
)


def read_metrics(paths: Paths) -> dict[str, Any]:
    """``reports/metrics.json`` with the adapted model's test metrics for every task."""
    metrics = read_report(paths.metrics, "evaluate")
    for task, t in metrics.get("tasks", {}).items():
        if "adapted" not in t or t.get("primary") not in t["adapted"]:
            raise DataError(
                paths.metrics, None, "incomplete-metrics", f"task '{task}' has no adapted {t.get('primary')} value"
            )
    if not metrics.get("tasks"):
        raise DataError(paths.metrics, None, "incomplete-metrics", "no tasks were evaluated")
    return metrics


def input_example(paths: Paths) -> Any:
    """One request row per task, from the first example of each task's test split."""
    from pipeline.serving.service import requests_from_tasks

    return requests_from_tasks(paths.tasks, per_task=1)


def pinned(packages: tuple[str, ...]) -> list[str]:
    """``package==installed version`` for each of ``packages`` (the model's pip requirements)."""
    return [f"{p}=={installed(p)}" for p in packages]


def params_hash(cfg: Config) -> str:
    return hashlib.sha256(json.dumps(cfg.model_dump(mode="json", by_alias=True), sort_keys=True).encode()).hexdigest()[
        :16
    ]


def log_pyfunc(cfg: Config, paths: Paths) -> Any:
    """Log ``models/finetuned`` as a pyfunc in the active run, load it back, and check it answers its example."""
    import mlflow

    example = input_example(paths)
    info = _log(cfg, paths, example)
    answers = mlflow.pyfunc.load_model(info.model_uri).predict(example)
    if len(answers) != len(example):
        raise DataError(
            paths.finetuned,
            None,
            "model-does-not-serve",
            f"the logged model answered {len(answers)} of {len(example)} rows",
        )
    return info


def _log(cfg: Config, paths: Paths, example: Any) -> Any:
    import mlflow

    import pipeline
    from pipeline.serving.service import signature

    return mlflow.pyfunc.log_model(
        name="model",
        python_model=str(Path(pipeline.__file__).parent / "serving" / "pyfunc_model.py"),
        artifacts={"model_dir": str(paths.finetuned)},
        model_config={
            "max_seq_length": cfg.tokenize.max_seq_length,
            "doc_stride": cfg.tokenize.doc_stride,
            "batch_size": cfg.evaluate.batch_size,
            "precision": cfg.precision,
        },  # auto resolves where it is served
        code_paths=[str(Path(pipeline.__file__).parent)],
        signature=signature(),
        input_example=example,
        pip_requirements=pinned(SERVING_PACKAGES),
    )


def log_fill_mask(paths: Paths) -> str:
    """``models/dapt`` as an MLflow transformers ``fill-mask`` model; returns its model URI.

    Logged as a pipeline object with explicit requirements: with transformers 5 and MLflow 3.17,
    logging the checkpoint path fails (MLflow reads the pipeline class from a registry entry that
    transformers 5 turned into a string), and the inferred requirements ask for torchvision.
    """
    import mlflow
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(paths.dapt), tokenizer=str(paths.dapt))
    info = mlflow.transformers.log_model(
        transformers_model=fill, name="fill_mask", pip_requirements=pinned(("torch", "transformers", "tokenizers"))
    )
    return str(info.model_uri)


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Register ``models/finetuned`` as a new version, move ``challenger``, gate ``champion``; write the report."""
    import mlflow
    from mlflow import MlflowClient

    from pipeline.tracking.registry import (
        CHALLENGER,
        Rules,
        ensure_registered_model,
        promote,
        record_verdict,
        version_tags_from_metrics,
    )
    from pipeline.tracking.runs import lineage_tags

    rc = cfg.registration
    require_inputs({paths.finetuned: "finetune"})
    metrics = read_metrics(paths)
    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("register needs an active MLflow run (use pipeline.tracking.runs.stage_run)")
    start = time.perf_counter()
    info = log_pyfunc(cfg, paths)
    fill_mask = log_fill_mask(paths) if rc.log_fill_mask else None
    client = MlflowClient()
    ensure_registered_model(client, rc.model_name)
    tags = {**lineage_tags(paths), **version_tags_from_metrics(metrics), "params_hash": params_hash(cfg)}
    mv = client.create_model_version(
        rc.model_name, source=info.model_uri, run_id=run.info.run_id, tags=tags, model_id=info.model_id
    )
    version = str(mv.version)
    client.set_registered_model_alias(rc.model_name, CHALLENGER, version)
    decision = promote(client, rc.model_name, version, Rules.from_config(rc))
    record_verdict(client, rc.model_name, decision)
    v = decision.verdict
    report = {
        "model_name": rc.model_name,
        "version": version,
        "model_uri": f"models:/{rc.model_name}/{version}",
        "run_id": run.info.run_id,
        "tracking_uri": mlflow.get_tracking_uri(),
        "fill_mask_model_uri": fill_mask,
        "promoted": decision.promoted,
        "reason": v.reason,
        "champion_before": decision.previous_champion,
        "champion_after": decision.champion_after,
        "mean_primary_challenger": v.mean_challenger,
        "mean_primary_champion": v.mean_champion,
        "table": v.rows,
        "rules": rc.model_dump(),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_json(paths.promotion_report, report)
    return report


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline register`` (what ``run`` returned, read for a person)."""
    champion = (
        f"champion moved {r['champion_before'] or '(none)'} -> {r['champion_after']}"
        if r["promoted"]
        else f"champion stays {r['champion_after'] or '(none)'}"
    )
    return (
        f"{r['model_name']} version {r['version']} registered (alias challenger); {champion}\n{r['reason']}\n"
        f"report: {paths.promotion_report}"
    )
