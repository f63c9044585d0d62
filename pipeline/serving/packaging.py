"""A served model packaged for MLflow: a pyfunc with signature, input example, pinned requirements and the
``pipeline`` code, loaded back and asked its example before anything is registered; and the adapted
encoder as a ``fill-mask`` model.
"""

from __future__ import annotations

import tempfile
from importlib.metadata import version as installed
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import DataError
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


def input_example(paths: Paths) -> Any:
    """One request row per task, from the first example of each task's test split."""
    from pipeline.serving.service import requests_from_tasks

    return requests_from_tasks(paths.tasks, per_task=1)


def pinned(packages: tuple[str, ...]) -> list[str]:
    """``package==installed version`` for each of ``packages`` (the model's pip requirements)."""
    return [f"{p}=={installed(p)}" for p in packages]


def log_pyfunc(cfg: Config, paths: Paths, model_dir: Path, name: str = "model") -> Any:
    """Log ``model_dir`` as a pyfunc in the active run, load it back, and check it answers its example."""
    import mlflow

    example = input_example(paths)
    info = _log(cfg, paths, example, model_dir, name)
    # loaded from a directory of ours: without dst_path MLflow downloads the model into a fresh /tmp/tmpXXXX that it
    # never removes (one model copy per registered model per run, ~90 MB each for MiniLM)
    with tempfile.TemporaryDirectory(prefix="adaptbert-served-") as tmp:
        answers = mlflow.pyfunc.load_model(info.model_uri, dst_path=tmp).predict(example)
    if len(answers) != len(example):
        raise DataError(
            model_dir,
            None,
            "model-does-not-serve",
            f"the logged model answered {len(answers)} of {len(example)} rows",
        )
    return info


def _log(cfg: Config, paths: Paths, example: Any, model_dir: Path, name: str) -> Any:
    import mlflow

    import pipeline
    from pipeline.serving.service import signature

    return mlflow.pyfunc.log_model(
        name=name,
        python_model=str(Path(pipeline.__file__).parent / "serving" / "pyfunc_model.py"),
        artifacts={"model_dir": str(model_dir)},
        model_config={
            "max_seq_length": cfg.tokenize.max_seq_length,
            "doc_stride": cfg.tokenize.doc_stride,
            "batch_size": cfg.evaluate.batch_size,
            "precision": cfg.precision,
            "max_request_chars": cfg.registration.serve.max_request_chars,
        },  # auto resolves where it is served
        code_paths=[str(Path(pipeline.__file__).parent)],
        signature=signature(),
        input_example=example,
        pip_requirements=pinned(SERVING_PACKAGES),
    )


def fill_mask_source(paths: Paths) -> Path:
    """The masked LM that pretraining left: ``models/dapt``, or after ELECTRA (whose encoder has no MLM head) the
    generator it trained beside it."""
    from pipeline.modelling.electra import GENERATOR_DIR

    generator = paths.dapt / GENERATOR_DIR
    return generator if generator.is_dir() else paths.dapt


def log_fill_mask(paths: Paths) -> str:
    """``models/dapt`` (with ``objective: electra`` its generator) as an MLflow transformers ``fill-mask`` model;
    returns its model URI.

    Logged as a pipeline object with explicit requirements: with transformers 5 and MLflow 3.17,
    logging the checkpoint path fails (MLflow reads the pipeline class from a registry entry that
    transformers 5 turned into a string), and the inferred requirements ask for torchvision.
    """
    import mlflow
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(fill_mask_source(paths)), tokenizer=str(paths.dapt))
    info = mlflow.transformers.log_model(
        transformers_model=fill, name="fill_mask", pip_requirements=pinned(("torch", "transformers", "tokenizers"))
    )
    return str(info.model_uri)
