"""ingest stage: sources -> normalised, deduplicated, split corpus + normalised task splits.

Streaming throughout: corpus documents are read one at a time and written to Parquet shards listed by a manifest
(:mod:`pipeline.text.corpus_shards`), in row groups of ``ingest.chunk_docs`` (``ingest.index: disk``: the dedup
indexes sorted on disk, bounded memory; ``ingest.engine: ray``: Ray Data tasks over the source files; the same files
either way). Task data (labelled, small) is read whole per split. Outputs replace the previous ones only when the whole stage succeeded.
"""

from __future__ import annotations

import time

from pipeline.core.config import Config
from pipeline.core.errors import DataError
from pipeline.core.io import transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.ingest import IngestReport
from pipeline.tasks.reading import ingest_tasks
from pipeline.text.corpus import (
    LeakageGuard,
    NearChecks,
    decontamination_report,
    ingest_corpus,
    near_duplicate_report,
)
from pipeline.text.corpus_disk import ingest_corpus_disk
from pipeline.text.corpus_shards import SPLITS, write_corpus_manifest
from pipeline.text.readers import ErrorPolicy

# ----------------------------------------------------------------------------- stage


def run(cfg: Config, paths: Paths) -> IngestReport:
    """Ingest tasks and corpus per ``cfg.ingest``; write outputs and ``reports/ingest.json``.

    Raises :class:`DataError` on bad input under ``on_error: fail``, or when nothing usable is
    left; the previous outputs then stay untouched.
    """
    ic = cfg.ingest
    start = time.perf_counter()
    task_policy = ErrorPolicy(ic.on_error)
    corpus_policy = ErrorPolicy(ic.on_error)
    with transaction(paths.root, "ingest") as txn:
        tasks_tmp, corpus_tmp = txn.dir(paths.tasks), txn.dir(paths.corpus)
        task_stats, leak = ingest_tasks(ic, tasks_tmp, task_policy, paths.root)
        guard = LeakageGuard(leak, ic.leakage_min_chars)
        near = NearChecks(ic, leak)
        if ic.engine == "ray":
            from pipeline.text.corpus_ray import ingest_corpus_ray  # imports Ray: only when that engine is chosen

            stats = ingest_corpus_ray(ic, cfg.ray, corpus_tmp, guard, near, corpus_policy, paths.root)
        elif ic.index == "disk":
            stats = ingest_corpus_disk(ic, corpus_tmp, guard, near, corpus_policy, paths.root)
        else:
            stats = ingest_corpus(ic, corpus_tmp, guard, near, corpus_policy, paths.root)
        if stats.kept["train"] == 0:
            raise DataError(
                "ingest.corpus.sources",
                None,
                "no-documents",
                f"no document left for training after filters ({stats.read} read, "
                f"dropped {dict(stats.dropped)}, errors {dict(corpus_policy.counts)})",
            )
        write_corpus_manifest(corpus_tmp, stats.shards)
        seconds = time.perf_counter() - start
        found = {
            "corpus": {
                "documents_read": stats.read,
                "documents_kept": sum(stats.kept.values()),
                "train_documents": stats.kept["train"],
                "validation_documents": stats.kept["validation"],
                "dropped": dict(sorted(stats.dropped.items())),
                "errors_skipped": dict(sorted(corpus_policy.counts.items())),
                "error_examples": corpus_policy.examples,
                "duplicate_ratio": round(stats.dropped["duplicate"] / stats.read, 6) if stats.read else 0.0,
                "characters": stats.characters,
                "words": stats.words,
                "shards": {split: sum(s.split == split for s in stats.shards) for split in SPLITS},
                "sources": {s: {"read": c["read"], "kept": c["kept"]} for s, c in stats.sources.items()},
                "empty_sources": [s for s, c in stats.sources.items() if c["kept"] == 0],
            },
            "tasks": task_stats,
            "task_errors_skipped": dict(sorted(task_policy.counts.items())),
            "task_error_examples": task_policy.examples,
            "leakage": {"evaluation_texts_indexed": guard.size, "documents_dropped": stats.dropped["leakage"]},
            "near_duplicates": near_duplicate_report(ic, stats),
            "decontamination": decontamination_report(ic, near, stats),
            "engine": ic.engine,
            "index": ic.index if ic.engine == "local" else None,  # memory | disk (null: the Ray engine)
            "engine_cluster": stats.cluster,  # ray: {"joined": an existing cluster (else a local one), "cpus": its CPUs}
            "seconds": round(seconds, 2),
            "near_checks_seconds": round(near.seconds, 2),  # of them, the batched MinHash checks
            "engine_seconds": {
                step: round(s, 2) for step, s in stats.step_seconds.items()
            },  # the Ray engine's and the on-disk index's steps
        }
        report = IngestReport.model_validate(found)
        txn.write_report(paths.ingest_report, report)
    return report


def summary(r: IngestReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline ingest`` (what ``run`` returned, read for a person)."""
    c = r.corpus
    dropped = ", ".join(f"{k} {v}" for k, v in c.dropped.items()) or "none"
    skipped = ", ".join(f"{k} {v}" for k, v in c.errors_skipped.items())
    tasks = "; ".join(f"{name} {'/'.join(str(s.examples) for s in t.splits.values())}" for name, t in r.tasks.items())
    task_skips = ", ".join(f"{k} {v}" for k, v in r.task_errors_skipped.items())
    empty = c.empty_sources
    warning = (
        f"\nwarning: {len(empty)} source(s) contributed no document: {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}"
        if empty
        else ""
    )
    return (
        f"{c.documents_read} documents read from {len(c.sources)} source(s) -> {c.train_documents} train + "
        f"{c.validation_documents} validation (dropped: {dropped}{'; bad records skipped: ' + skipped if skipped else ''})\n"
        f"tasks (train/validation/test): {tasks or 'none'}{'; bad task records skipped: ' + task_skips if task_skips else ''}"
        f"{warning}{near_summary(r)}\n{r.seconds} s; report: {paths.ingest_report}"
    )


def near_summary(r: IngestReport) -> str:
    """Console lines on decontamination and near-duplicates (empty where both are off)."""
    lines = []
    dc, nd = r.decontamination, r.near_duplicates
    if dc.enabled:
        per_task = ", ".join(f"{t} {n}" for t, n in dc.by_task.items()) or "no tasks"
        lines.append(
            f"decontamination: {dc.documents_dropped} document(s) held a copy ({dc.exact_copies}) or near-copy "
            f"({dc.near_copies}) of a validation/test text ({per_task}; a sentence holding >= {dc.threshold} of one's "
            f"{dc.shingle_words}-word shingles, {dc.evaluation_sentences_indexed} sentences indexed)"
        )
        for task, examples in dc.examples.items():
            if examples:
                e = examples[0]
                lines.append(
                    f"  e.g. {task} {e.split}: {shorten(e.evaluation_sentence)!r} ~ {e.source}:{e.line} "
                    f"{shorten(e.corpus_sentence)!r} (containment {e.containment})"
                )
    if nd.enabled:
        lines.append(
            f"near-duplicates: {nd.documents_dropped} document(s) (Jaccard >= {nd.threshold} over "
            f"{nd.shingle_words}-word shingles with an earlier kept one)"
        )
    return "".join(f"\n{line}" for line in lines)


def shorten(text: str, width: int = 60) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (console examples)."""
    return text if len(text) <= width else text[: width - 1] + "…"
