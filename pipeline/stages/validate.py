"""validate stage: Great Expectations suites over the ingested corpus and task data.

Suites are built in code from the thresholds in ``params.yaml: validate`` (GX 1.x API,
ephemeral context). Rules GX has no expectation for (valid BIO, answer at its offset,
train/test overlap, tag set) are computed as derived columns here and then checked with
plain GX expectations, so every rule shows up in the report and the Data Docs alike.
Writes ``reports/validation.json`` and ``reports/data_docs/``; on failure raises
:class:`ValidationFailed` with a readable summary and nothing downstream runs.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from pipeline.core.config import Config
from pipeline.core.errors import MissingInput, ValidationFailed
from pipeline.core.io import data_digest, read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.sections.validate import CorpusChecks, TaskChecks
from pipeline.tasks.base import Check, TaskType
from pipeline.tasks.registry import kind_of
from pipeline.text.textnorm import text_hash


@dataclass
class Frame:
    """A DataFrame to validate (one GX batch) and its checks; ``name`` becomes the suite name."""

    name: str
    df: pd.DataFrame
    checks: list[Check]


# ----------------------------------------------------------------------------- corpus


def _nonprintable(text: str) -> int:
    if text.isprintable():  # fast path, C speed: nearly every document
        return 0
    return sum(1 for ch in text if not ch.isprintable() and ch != " ")


def corpus_doc_stats(corpus_dir: Path, max_docs: int) -> tuple[pd.DataFrame, int]:
    """Per-document numeric stats (no text kept), over an evenly spaced sample if large.

    Memory is bounded by ``max_docs`` rows of a few numbers, whatever the corpus size.
    """
    files = [corpus_dir / f"{s}.parquet" for s in ("train", "validation")]
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    stride = max(1, math.ceil(total / max_docs))
    rows: dict[str, list[Any]] = {
        k: [] for k in ("split", "source", "line", "chars", "words", "replacement_share", "nonprintable_share")
    }
    i = 0
    for f in files:
        split = f.stem
        for batch in pq.ParquetFile(f).iter_batches(
            batch_size=4096, columns=["text", "source", "line", "chars", "words"]
        ):
            d = batch.to_pydict()
            for text, source, line, chars, words in zip(
                d["text"], d["source"], d["line"], d["chars"], d["words"], strict=True
            ):
                i += 1
                if (i - 1) % stride:
                    continue
                n = max(len(text), 1)
                rows["split"].append(split)
                rows["source"].append(source)
                rows["line"].append(line)
                rows["chars"].append(chars)
                rows["words"].append(words)
                rows["replacement_share"].append(text.count("\ufffd") / n)
                rows["nonprintable_share"].append(_nonprintable(text) / n)
    return pd.DataFrame(rows), total


def corpus_frames(paths: Paths, c: CorpusChecks) -> list[Frame]:
    """The corpus suites: per-document checks and corpus-level counts from the ingest report."""
    import great_expectations as gx

    E = gx.expectations
    docs, total = corpus_doc_stats(paths.corpus, c.max_docs_checked)
    report = read_report(paths.ingest_report, "ingest").get("corpus") or {}
    if "duplicate_ratio" not in report:
        raise MissingInput(paths.ingest_report, "has no corpus.duplicate_ratio (written by another version?)", "ingest")
    summary = pd.DataFrame(
        [
            {
                "documents_kept": total,
                "duplicate_ratio": report["duplicate_ratio"],
                "source": str(paths.ingest_report),
                "line": None,
            }
        ]
    )
    doc_view = ("split", "chars", "words")
    return [
        Frame(
            "corpus.summary",
            summary,
            [
                Check(
                    E.ExpectColumnValuesToBeBetween(column="documents_kept", min_value=c.min_docs),
                    f"at least {c.min_docs} documents kept",
                    ("documents_kept",),
                ),
                Check(
                    E.ExpectColumnValuesToBeBetween(column="duplicate_ratio", max_value=c.max_duplicate_ratio),
                    f"exact-duplicate ratio at most {c.max_duplicate_ratio}",
                    ("duplicate_ratio",),
                ),
            ],
        ),
        Frame(
            "corpus.documents",
            docs,
            [
                Check(E.ExpectColumnValuesToNotBeNull(column="chars"), "no null document", doc_view),
                Check(E.ExpectColumnValuesToBeBetween(column="chars", min_value=1), "no empty document", doc_view),
                Check(
                    E.ExpectColumnValuesToBeBetween(
                        column="chars", min_value=c.min_chars, max_value=c.max_chars, mostly=c.length_mostly
                    ),
                    f"at least {c.length_mostly:.0%} of documents have {c.min_chars}..{c.max_chars} characters",
                    doc_view,
                ),
                Check(
                    E.ExpectColumnMedianToBeBetween(
                        column="chars", min_value=c.median_chars_min, max_value=c.median_chars_max
                    ),
                    f"median document length within {c.median_chars_min:g}..{c.median_chars_max:g} characters",
                    doc_view,
                ),
                Check(
                    E.ExpectColumnMeanToBeBetween(column="replacement_share", max_value=c.max_replacement_char_share),
                    f"mean share of U+FFFD replacement characters at most {c.max_replacement_char_share}",
                    ("replacement_share",),
                ),
                Check(
                    E.ExpectColumnMeanToBeBetween(column="nonprintable_share", max_value=c.max_nonprintable_share),
                    f"mean share of non-printable characters at most {c.max_nonprintable_share}",
                    ("nonprintable_share",),
                ),
            ],
        ),
    ]


# ----------------------------------------------------------------------------- tasks


def _task_text(kind: TaskType, row: pd.Series) -> str:
    return "\n".join(kind.input_texts(row))


def task_frames(task_dir: Path, t: TaskChecks) -> list[Frame]:
    """Suites for one task: per split (content rules) and the train label distribution."""
    import great_expectations as gx

    E = gx.expectations
    meta = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))
    name, labels = meta["name"], meta["labels"]
    kind = kind_of(meta["type"], str(task_dir / "task.json"))
    splits = {}
    for split in ("train", "validation", "test"):
        df = pq.read_table(task_dir / f"{split}.parquet").to_pandas()
        splits[split] = (
            df
            if "source_line" in df.columns
            else pd.DataFrame(columns=["id", "source_file", "source_line", *kind.columns])
        )
    train_hashes = {text_hash(_task_text(kind, r)) for _, r in splits["train"].iterrows()}
    frames = []
    for split, df in splits.items():
        df = df.copy()
        where = meta.get("files", {}).get(split, f"{name}/{split}")
        checks = [
            Check(
                E.ExpectTableRowCountToBeBetween(min_value=max(t.min_examples, 1)),
                f"at least {max(t.min_examples, 1)} examples read from {where} (after ingest's filters)",
                (),
            )
        ]
        checks += kind.checks(df, labels, split, E)
        if split != "train":
            df["in_train"] = [text_hash(_task_text(kind, r)) in train_hashes for _, r in df.iterrows()]
            checks.append(
                Check(
                    E.ExpectColumnValuesToBeInSet(column="in_train", value_set=[False], mostly=1 - t.max_train_overlap),
                    f"at most {t.max_train_overlap:.1%} of {split} examples also in train",
                    ("text",) if "text" in df else (kind.columns[0],),
                )
            )
        frames.append(
            Frame(f"task.{name}.{split}", df.rename(columns={"source_file": "source", "source_line": "line"}), checks)
        )
    counts = kind.label_counts(splits["train"])
    if counts is not None:
        frames.append(label_count_frame(name, labels, counts, t, E))
    return frames


def label_count_frame(name: str, labels: list[str], counts: Counter[str], t: TaskChecks, E: Any) -> Frame:
    """Train examples per label (tag occurrences for NER), every declared label included."""
    df = pd.DataFrame(
        {
            "label": labels,
            "count": [counts.get(lbl, 0) for lbl in labels],
            "source": [f"{name}/train"] * len(labels),
            "line": [None] * len(labels),
        }
    )
    return Frame(
        f"task.{name}.labels",
        df,
        [
            Check(
                E.ExpectColumnValuesToBeBetween(column="count", min_value=t.min_examples_per_label),
                f"at least {t.min_examples_per_label} train examples per label",
                ("label", "count"),
            )
        ],
    )


# ----------------------------------------------------------------------------- running GX


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def _offending(frame: Frame, check: Check, result: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    df = frame.df
    if "unexpected_index_list" in result:
        idx = list(result["unexpected_index_list"])[:limit]
    else:  # aggregate expectation: show the most extreme documents of the column
        col = check.expectation.column if hasattr(check.expectation, "column") else None
        if col is None or col not in df or df.empty:
            return []
        idx = list(df[col].sort_values(ascending=False).index[:limit])
    out = []
    for i in idx:
        row = df.loc[i]
        values = {c: _jsonable(row[c]) for c in check.preview if c in df.columns}
        values = {c: (v[:120] + "..." if isinstance(v, str) and len(v) > 120 else v) for c, v in values.items()}
        out.append({"file": row.get("source"), "line": _jsonable(row.get("line")), "values": values})
    return out


def run_suites(frames: list[Frame], docs_dir: Path, max_offending: int) -> list[dict[str, Any]]:
    """Run every frame's suite in one ephemeral GX context; build Data Docs into ``docs_dir``."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    ctx.add_data_docs_site(
        site_name="local",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir.resolve())},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    source = ctx.data_sources.add_pandas("adaptbert")
    suites = []
    for frame in frames:
        batch_def = source.add_dataframe_asset(name=frame.name).add_batch_definition_whole_dataframe("all")
        suite = ctx.suites.add(gx.ExpectationSuite(name=frame.name))
        ids = []
        for check in frame.checks:
            check.expectation.description = check.rule
            ids.append(suite.add_expectation(check.expectation).id)
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=frame.name, data=batch_def, suite=suite))
        res = vd.run(batch_parameters={"dataframe": frame.df}, result_format="COMPLETE")
        results = []
        by_id = {er.expectation_config.id: er for er in res.results}  # GX does not keep the suite's order
        for check, er in ((c, by_id[i]) for c, i in zip(frame.checks, ids, strict=True)):
            r = er.result or {}
            results.append(
                {
                    "expectation": er.expectation_config.type,
                    "rule": check.rule,
                    "success": bool(er.success),
                    "observed": _jsonable(
                        r.get(
                            "observed_value",
                            {k: r[k] for k in ("unexpected_count", "unexpected_percent", "element_count") if k in r},
                        )
                    ),
                    "expected": _jsonable(
                        {
                            k: v
                            for k, v in er.expectation_config.kwargs.items()
                            if k not in ("batch_id", "column", "description")
                        }
                    ),
                    "column": er.expectation_config.kwargs.get("column"),
                    "exception": (er.exception_info or {}).get("exception_message") if not er.success else None,
                    "offending": [] if er.success else _offending(frame, check, r, max_offending),
                }
            )
        suites.append(
            {
                "suite": frame.name,
                "rows": len(frame.df),
                "success": all(x["success"] for x in results),
                "expectations": results,
            }
        )
    ctx.build_data_docs(site_names=["local"])
    return suites


def summarize(suites: list[dict[str, Any]]) -> str:
    """Readable failure list: suite, rule, observed vs expected, then offending records."""
    failed = [(s["suite"], e) for s in suites for e in s["expectations"] if not e["success"]]
    total = sum(len(s["expectations"]) for s in suites)
    lines = [f"{len(failed)} of {total} expectations failed:"]
    for suite, e in failed:
        col = f"({e['column']})" if e["column"] else ""
        lines.append(f"  [{suite}] {e['rule']}  -- {e['expectation']}{col}")
        lines.append(
            f"      observed: {json.dumps(e['observed'], ensure_ascii=False)[:200]}; expected: {json.dumps(e['expected'], ensure_ascii=False)[:200]}"
        )
        if e.get("exception"):
            lines.append(f"      error: {e['exception'][:200]}")
        for o in e["offending"]:
            where = f"{o['file']}:{o['line']}" if o["line"] is not None else str(o["file"])
            lines.append(f"      {where}  {json.dumps(o['values'], ensure_ascii=False)[:200]}")
    return "\n".join(lines)


def run(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Validate corpus and tasks; write the report and Data Docs; raise if anything failed.

    On success also writes ``reports/validated.json``, the gate later stages depend on: its
    content changes only when the validated data does, so a new threshold re-runs nothing else.
    """
    v = cfg.validation
    require_inputs({paths.corpus: "ingest", paths.tasks: "ingest", paths.ingest_report: "ingest"})
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
