"""validate stage: Great Expectations suites over the ingested corpus and task data.

Suites are built in code from the thresholds in ``params.yaml: validate`` (GX 1.x API,
ephemeral context). Rules GX has no expectation for (valid BIO, answer at its offset,
train/test overlap, tag set) are computed as derived columns here and then checked with
plain GX expectations, so every rule shows up in the report and the Data Docs alike.
Writes ``reports/validation.json`` and ``reports/data_docs/``; on failure raises
:class:`ValidationFailed` with a readable summary and nothing downstream runs.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import ValidationFailed
from pipeline.core.io import data_digest, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.validation.frames import corpus_frames, task_frames
from pipeline.validation.suites import run_suites, summarize


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Validate corpus and tasks; write the report and Data Docs; raise if anything failed.

    On success also writes ``reports/validated.json``, the gate later stages depend on: its
    content changes only when the validated data does, so a new threshold re-runs nothing else.
    """
    v = cfg.validation
    require_inputs(paths.corpus, paths.tasks, paths.ingest_report)
    frames = corpus_frames(paths, v.corpus)
    for task_dir in sorted(p for p in paths.tasks.iterdir() if (p / "task.json").exists()):
        frames += task_frames(task_dir, v.tasks)
    with transaction(paths.root, "validate") as txn:
        suites = run_suites(frames, txn.dir(paths.data_docs), v.max_offending_records)
        n_failed = sum(not e["success"] for s in suites for e in s["expectations"])
        n_total = sum(len(s["expectations"]) for s in suites)
        report = {
            "success": n_failed == 0,
            "expectations": n_total,
            "failed_expectations": n_failed,
            "failed_suites": [s["suite"] for s in suites if not s["success"]],
            "suites": suites,
        }
        txn.write_json(paths.validation_report, report)
        if not n_failed:  # the gate: written only for data that passed, with that data's digest
            txn.write_json(
                paths.validated_stamp, {"validated": True, "data_sha256": data_digest([paths.corpus, paths.tasks])}
            )
    if n_failed:  # the failing report and Data Docs are committed, so the user can read them
        raise ValidationFailed(
            summarize(suites) + f"\nfull report: {paths.validation_report}; Data Docs: {paths.data_docs / 'index.html'}"
        )
    return {"expectations": n_total, "failed_expectations": 0, "suites": len(suites)}


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline validate`` (what ``run`` returned, read for a person)."""
    return (
        f"all {r['expectations']} expectations in {r['suites']} suites passed; "
        f"report: {paths.validation_report}; Data Docs: {paths.data_docs / 'index.html'}"
    )
