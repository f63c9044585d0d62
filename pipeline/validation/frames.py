"""What the validate stage checks, as frames: a DataFrame per GX batch and the checks on it.

Rules GX has no expectation for (valid BIO, answer at its offset, train/test overlap, tag set) are
computed here as derived columns, then checked with plain GX expectations (:mod:`pipeline.validation.suites`),
so every rule shows up in the report and the Data Docs alike. The corpus checks read per-document
statistics of up to ``validate.corpus.max_docs`` documents; a task's checks come from its type.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.ingest import IngestReport
from pipeline.core.sections.validate import CorpusChecks, TaskChecks
from pipeline.tasks.base import Check, TaskType
from pipeline.tasks.registry import kind_of
from pipeline.text.corpus_shards import SPLITS, corpus_files
from pipeline.text.textnorm import text_hash


@dataclass
class Frame:
    """A DataFrame to validate (one GX batch) and its checks; ``name`` becomes the suite name."""

    name: str
    df: pd.DataFrame
    checks: list[Check]


def _nonprintable(text: str) -> int:
    if text.isprintable():  # fast path, C speed: nearly every document
        return 0
    return sum(1 for ch in text if not ch.isprintable() and ch != " ")


def corpus_doc_stats(corpus_dir: Path, max_docs: int) -> tuple[pd.DataFrame, int]:
    """Per-document numeric stats (no text kept), over an evenly spaced sample if large.

    Memory is bounded by ``max_docs`` rows of a few numbers, whatever the corpus size.
    """
    files = [(split, f) for split in SPLITS for f in corpus_files(corpus_dir, split)]
    total = sum(pq.ParquetFile(f).metadata.num_rows for _, f in files)
    stride = max(1, math.ceil(total / max_docs))
    rows: dict[str, list[Any]] = {
        k: [] for k in ("split", "source", "line", "chars", "words", "replacement_share", "nonprintable_share")
    }
    i = 0
    for split, f in files:
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
    ingested = read_report(paths.ingest_report, IngestReport)  # one of another version: "run dvc repro ingest"
    summary = pd.DataFrame(
        [
            {
                "documents_kept": total,
                "duplicate_ratio": ingested.corpus.duplicate_ratio,
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
