"""Where each stage reads and writes, relative to the project root.

These locations are fixed by ``dvc.yaml`` (its ``deps``/``outs``), so they are code, not
params: a user changes inputs in ``params.yaml`` and never needs to move outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    """Every stage input/output location under one project ``root``."""

    root: Path = Path(".")

    @property
    def demo(self) -> Path:
        return self.root / "data" / "demo"

    @property
    def domain_terms(self) -> Path:
        """The demo's domain terms (``tokenize.domain_terms`` of the default params)."""
        return self.demo / "domain_terms.txt"

    @property
    def corpus(self) -> Path:
        return self.root / "data" / "corpus"

    @property
    def tasks(self) -> Path:
        return self.root / "data" / "tasks"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def ingest_report(self) -> Path:
        return self.reports / "ingest.json"

    @property
    def validation_report(self) -> Path:
        return self.reports / "validation.json"

    @property
    def validated_stamp(self) -> Path:
        return self.reports / "validated.json"

    @property
    def data_docs(self) -> Path:
        return self.reports / "data_docs"

    @property
    def tokenizer(self) -> Path:
        return self.root / "models" / "tokenizer"

    @property
    def tokenized(self) -> Path:
        return self.root / "data" / "tokenized"

    @property
    def pretrain_blocks(self) -> Path:
        """The packed blocks pretraining reads: ``manifest.json`` and a folder of Arrow shards per group (``train/``,
        ``validation/``, ``task_text/``; :mod:`pipeline.modelling.shards`)."""
        return self.tokenized / "pretrain"

    @property
    def task_features(self) -> Path:
        """One folder per task with its tokenized splits."""
        return self.tokenized / "tasks"

    @property
    def tokenize_report(self) -> Path:
        return self.reports / "tokenize.json"

    @property
    def selection(self) -> Path:
        """``selection.json`` (and ``blocks.npy``, the chosen block indices, with ``pretrain.selection: nearest``)."""
        return self.root / "data" / "selection"

    @property
    def embeddings(self) -> Path:
        """The sentence-embedding cache of the select stage: one ``<content hash>.npy`` per corpus shard."""
        return self.root / "data" / "embeddings"

    @property
    def select_report(self) -> Path:
        return self.reports / "select.json"

    @property
    def dapt(self) -> Path:
        return self.root / "models" / "dapt"

    @property
    def pretrain_checkpoints(self) -> Path:
        return self.root / "checkpoints" / "pretrain"

    @property
    def adapt(self) -> Path:
        """``chosen.json``: the adaptation the adapt stage chose (``adapt.strategy: auto``), which pretrain trains."""
        return self.root / "data" / "adapt"

    @property
    def adapt_checkpoints(self) -> Path:
        """The tournament's work, one folder per configuration digest: a finished arm's result is kept there."""
        return self.root / "checkpoints" / "adapt"

    @property
    def adapt_report(self) -> Path:
        return self.reports / "adapt.json"

    @property
    def pretrain_report(self) -> Path:
        return self.reports / "pretrain.json"

    @property
    def pretrain_curves(self) -> Path:
        """``train.csv`` (loss per logging step) and ``eval.csv`` (held-out loss and perplexity): DVC plots."""
        return self.reports / "pretrain"

    @property
    def pretrain_curves_in_progress(self) -> Path:
        """Where pretraining appends its curves while it runs: beside its checkpoints (trimmed to the step a resumed
        run starts from); the stage's commit copies them to :attr:`pretrain_curves`, so a failed run leaves the
        last good run's curves untouched."""
        return self.pretrain_checkpoints / "curves"

    @property
    def search(self) -> Path:
        """``chosen.json``: the fine-tuning values the search stage chose per model (empty with search off)."""
        return self.root / "data" / "search"

    @property
    def search_checkpoints(self) -> Path:
        """A trial's checkpoints while it trains (removed when it ends)."""
        return self.root / "checkpoints" / "search"

    @property
    def search_report(self) -> Path:
        return self.reports / "search.json"

    @property
    def finetuned(self) -> Path:
        return self.root / "models" / "finetuned"

    @property
    def baseline(self) -> Path:
        return self.root / "models" / "baseline"

    @property
    def finetune_checkpoints(self) -> Path:
        return self.root / "checkpoints" / "finetune"

    @property
    def finetune_report(self) -> Path:
        return self.reports / "finetune.json"

    @property
    def finetune_curves(self) -> Path:
        """A folder per fine-tuned model (``adapted/``, ``baseline/``) with ``train.csv`` and ``dev.csv``: DVC plots."""
        return self.reports / "finetune"

    @property
    def metrics(self) -> Path:
        return self.reports / "metrics.json"

    @property
    def evaluation(self) -> Path:
        return self.reports / "evaluation.md"

    @property
    def plots(self) -> Path:
        return self.reports / "plots"

    @property
    def errors(self) -> Path:
        """The error analysis: per task the confusions, the most confident mistakes, seen vs unseen mentions."""
        return self.reports / "errors.json"

    @property
    def predictions(self) -> Path:
        """``<task>.jsonl`` per task: every test example with the gold answer and each model's (DVC-cached)."""
        return self.reports / "predictions"

    @property
    def compressed(self) -> Path:
        """One directory per compressed variant (``int8/``, ``distilled/``, ...)."""
        return self.root / "models" / "compressed"

    @property
    def compress_checkpoints(self) -> Path:
        return self.root / "checkpoints" / "compress"

    @property
    def compression_report(self) -> Path:
        return self.reports / "compression.json"

    @property
    def compression_markdown(self) -> Path:
        return self.reports / "compression.md"

    @property
    def compression_plots(self) -> Path:
        """The accuracy/latency front and the compression learning curves."""
        return self.reports / "compression"

    @property
    def promotion_report(self) -> Path:
        """The gate's table, versions and run ids: a registry event, not versioned (git-ignored)."""
        return self.reports / "promotion.json"

    @property
    def run_report(self) -> Path:
        """The run on one self-contained HTML page (``pipeline.reporting.html``)."""
        return self.reports / "index.html"

    @property
    def summary(self) -> Path:
        """The headline metrics (``pipeline.reporting.headline``): the one DVC metrics file."""
        return self.reports / "summary.json"

    @property
    def run_context(self) -> Path:
        """Ties the stages of one ``dvc repro`` to one MLflow parent run (not versioned)."""
        return self.root / ".adaptbert" / "mlflow-run.json"
