"""The pipeline's stages, each declared once: what it reports, tracks and publishes.

One record per stage, read by the CLI (``python -m pipeline <stage>``), MLflow tracking
(:mod:`pipeline.tracking.runs`: which report numbers are metrics and which are set-up params, which
files are artifacts) and the Prefect flow (:mod:`flows.pipeline`: the artifacts each stage publishes).
The stage's code is ``pipeline/stages/<name>.py``; its inputs and outputs are its ``dvc.yaml`` block
(``tests/architecture/test_stage_table.py`` checks that the names and their order match). Adding a stage = its
module, one entry here, its ``dvc.yaml`` block.

Names of report files and folders are attributes of :class:`pipeline.core.paths.Paths`; views name a
renderer of :mod:`pipeline.reporting.views` (a name, not the function: this floor imports nothing above it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.core.paths import Paths


@dataclass(frozen=True)
class View:
    """One Prefect artifact (a keyed table, markdown page or link, with history) made from a stage's report."""

    key: str  # the artifact key, shown on Prefect's Artifacts page
    kind: Literal["table", "markdown", "link"]
    description: str
    source: str  # the Paths attribute it is made from (a JSON report; for a link, the file linked to)
    render: str | None = None  # pipeline.reporting.views.<render>(report) -> rows or markdown, None: nothing to show


@dataclass(frozen=True)
class Stage:
    """A DVC stage as the CLI, MLflow tracking and the Prefect flow see it."""

    name: str
    inputs: tuple[str, ...] = ()  # the Paths attributes of other stages' outputs it reads (its dvc.yaml deps): sealed
    outputs: tuple[str, ...] = ()  # the Paths attributes it writes (its dvc.yaml outs, and what DVC does not version)
    report: str | None = None  # the Paths attribute of its JSON report: the numbers MLflow logs
    # ``fnmatch`` patterns over the report's dotted keys: its headline numbers (MLflow metrics, compared across
    # runs in the table) and the facts of its set-up (MLflow params); every number stays in the report artifact
    metrics: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()  # Paths attributes logged as MLflow artifacts (those that exist)
    views: tuple[View, ...] = ()
    report_failure: bool = False  # also log artifacts and publish views when the stage fails (validate: what failed)
    always_tracked: bool = False  # logs to MLflow even with tracking.enabled false (register: the registry is MLflow's)
    # its params section (named as the stage) has an ``engine``: under ``engine: ray`` its work runs on Ray and the
    # Prefect flow runs the stage as a Ray task on that cluster (ingest, tokenize)
    on_ray: bool = False
    # the ingested data it reads, logged as its MLflow run's dataset inputs (pipeline/tracking/datasets.py):
    # ``corpus/<split>`` and ``tasks/<split>`` (every task's split)
    datasets: tuple[str, ...] = ()


STAGES: tuple[Stage, ...] = (  # DAG order (dvc.yaml's)
    Stage("demo", outputs=("demo",)),
    Stage(
        "ingest",
        datasets=(
            "corpus/train",
            "corpus/validation",
            "tasks/train",
            "tasks/validation",
            "tasks/test",
        ),  # it wrote them
        inputs=("demo",),
        outputs=("ingest_report", "corpus", "tasks"),
        report="ingest_report",
        metrics=("corpus.documents_read", "corpus.documents_kept", "corpus.duplicate_ratio", "seconds"),
        artifacts=("ingest_report",),
        views=(
            View(
                "adaptbert-ingest",
                "table",
                "documents and examples read, kept, per split",
                "ingest_report",
                "ingest_table",
            ),
        ),
        on_ray=True,
    ),
    Stage(
        "validate",
        inputs=("corpus", "tasks", "ingest_report"),
        outputs=("data_docs", "validated_stamp", "validation_report"),
        report="validation_report",
        metrics=("expectations", "failed_expectations"),
        artifacts=("validation_report", "data_docs"),
        views=(
            View(
                "adaptbert-validation",
                "markdown",
                "Great Expectations: failed expectations first",
                "validation_report",
                "validation_markdown",
            ),
        ),
        report_failure=True,
    ),
    Stage(
        "tokenize",
        inputs=("corpus", "tasks", "validated_stamp", "domain_terms"),
        outputs=("tokenize_report", "tokenizer", "tokenized"),
        report="tokenize_report",
        metrics=("tokens", "blocks", "unk_share", "new_tokens", "fragmentation.pieces_per_*", "pack_tokens_per_s"),
        setup=("vocab_size", "base_vocab_size"),
        artifacts=("tokenize_report",),
        views=(
            View(
                "adaptbert-tokenize",
                "table",
                "vocabulary, tokens, blocks, fragmentation",
                "tokenize_report",
                "tokenize_table",
            ),
        ),
        on_ray=True,
    ),
    Stage(
        "select",
        inputs=("pretrain_blocks", "tokenizer", "tasks"),
        outputs=("select_report", "selection", "embeddings"),
        report="select_report",
        metrics=("selected_blocks", "selected_tokens", "selected_token_share", "tasks.*.mean_top1_cosine", "seconds"),
        artifacts=("select_report",),
    ),
    Stage(
        "adapt",
        inputs=("tokenized", "tokenizer", "tasks", "selection"),
        outputs=("adapt_report", "adapt", "adapt_checkpoints"),
        report="adapt_report",
        metrics=("dev_delta.*", "minutes_used", "seconds"),
        artifacts=("adapt_report",),
        views=(
            View(
                "adaptbert-adaptation",
                "markdown",
                "the adaptation chosen on dev: every arm's dev score per rung, the choice and why",
                "adapt_report",
                "adaptation_markdown",
            ),
        ),
    ),
    Stage(
        "pretrain",
        datasets=("corpus/train", "corpus/validation"),
        inputs=("pretrain_blocks", "tokenizer", "selection", "adapt"),
        outputs=("pretrain_report", "dapt", "pretrain_checkpoints", "pretrain_curves"),
        report="pretrain_report",
        # curves (loss, perplexity per step) come from the Trainer's own MLflow callback
        metrics=("tokens_seen", "train_seconds", "*tokens_per_s", "train_loss", "*_perplexity"),
        setup=("world_size", "global_batch", "block_length", "train_blocks", "task_text_blocks", "eval_blocks"),
        artifacts=("pretrain_report", "pretrain_curves"),
    ),
    Stage(
        "search",
        inputs=("dapt", "tokenized", "tasks"),
        outputs=("search_report", "search"),
        report="search_report",
        metrics=("models.*.chosen_dev_mean_primary", "models.*.default_dev_mean_primary", "seconds"),
        artifacts=("search_report",),
    ),
    Stage(
        "finetune",
        datasets=("tasks/train", "tasks/validation"),
        inputs=("dapt", "pretrain_report", "tokenized", "tasks", "search"),
        outputs=("finetune_report", "finetuned", "baseline", "finetune_checkpoints", "finetune_curves"),
        report="finetune_report",
        metrics=("*.steps", "*.best_step", "*.best_dev_mean_primary", "*.train_seconds", "*.train_examples_per_s"),
        setup=("*.vocab_size", "tasks.*.train_features"),
        artifacts=("finetune_report", "finetune_curves"),
    ),
    Stage(
        "evaluate",
        datasets=("tasks/test",),
        inputs=("finetuned", "baseline", "tokenized", "tasks", "pretrain_report", "finetune_report", "finetune_curves"),
        outputs=("metrics", "evaluation", "plots", "errors", "predictions"),
        report="metrics",
        metrics=("summary.*", "tasks.*.delta", "tasks.*.ci_low", "tasks.*.ci_high"),
        artifacts=("metrics", "evaluation", "plots", "errors", "predictions"),
        views=(
            View(
                "adaptbert-metrics",
                "table",
                "test metrics per task (adapted, baseline, trivial)",
                "metrics",
                "metrics_table",
            ),
            View(
                "adaptbert-verdict",
                "markdown",
                "what domain adaptation bought: the mean gain, each task's CI, how many clear 0",
                "metrics",
                "verdict_markdown",
            ),
            View(
                "adaptbert-dapt-vs-baseline",
                "table",
                "primary metric, delta and bootstrap CI per task",
                "metrics",
                "dapt_table",
            ),
        ),
    ),
    Stage(
        "compress",
        inputs=("finetuned", "tokenized", "tasks"),
        outputs=(
            "compression_report",
            "compressed",
            "compress_checkpoints",
            "compression_markdown",
            "compression_plots",
        ),
        report="compression_report",
        metrics=("*mean_primary", "*mean_primary_delta", "*size_mb", "*.p50_ms", "seconds"),
        artifacts=("compression_report", "compression_markdown", "compression_plots"),
        views=(
            View(
                "adaptbert-compression",
                "table",
                "the accuracy/latency front: size, batch-1 latency, throughput, metric delta per variant",
                "compression_report",
                "compression_table",
            ),
        ),
    ),
    Stage(
        "register",
        inputs=("finetuned", "compressed", "metrics", "compression_report", "pretrain_report"),
        outputs=("summary", "promotion_report"),
        report="promotion_report",
        metrics=("mean_primary_challenger", "mean_primary_champion"),
        artifacts=("promotion_report",),
        always_tracked=True,
        views=(
            View(
                "adaptbert-promotion",
                "markdown",
                "the promotion gate's decision, with MLflow links",
                "promotion_report",
                "promotion_markdown",
            ),
        ),
    ),
    Stage(
        "report",
        inputs=(
            "ingest_report",
            "validation_report",
            "tokenize_report",
            "adapt_report",
            "pretrain_report",
            "pretrain_curves",
            "search_report",
            "metrics",
            "errors",
            "plots",
            "compression_report",
            "compression_plots",
            "promotion_report",
        ),
        outputs=("run_report",),
        artifacts=("run_report",),
        views=(
            View(
                "adaptbert-run-report",
                "link",
                "the whole run on one page: data, validation, curves, evaluation, compression, registry",
                "run_report",
            ),
        ),
    ),
)
NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
_BY_NAME = {s.name: s for s in STAGES}
_RELATIVE = Paths(Path())  # outputs relative to the project root


def stage_record(name: str) -> Stage:
    """The record of stage ``name`` (``KeyError`` for a name that is not a stage)."""
    return _BY_NAME[name]


def output_holding(path: Path, paths: Paths) -> Path | None:
    """The declared output (under ``paths``) that is ``path`` or holds it, if any stage writes one."""
    for stage in STAGES:
        for output in stage.outputs:
            out = getattr(paths, output)
            if path == out or out in path.parents:
                return out
    return None


def producer_of(path: Path) -> str | None:
    """The stage that writes ``path`` (one of its outputs, or a file inside one), under any project root; None
    for a file no stage writes (a user's input)."""
    parts = Path(path).parts
    for stage in STAGES:
        for output in stage.outputs:
            out = getattr(_RELATIVE, output).parts
            # the output's parts as a run of path's parts: root/<out>, root/<out>/inside
            if any(parts[end - len(out) : end] == out for end in range(len(out), len(parts) + 1)):
                return stage.name
    return None
