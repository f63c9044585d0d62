"""Task rows -> model inputs: labels aligned to word pieces, QA windows with answer positions.

Used by the tokenize stage (every split, written as Arrow) and by serving (QA windows of a request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.config import TokenizeConfig
from pipeline.core.errors import DataError, shorten
from pipeline.core.io import write_json
from pipeline.modelling.labels import IGNORE_INDEX


def _label_ids(rows: list[dict[str, Any]], key: str, label2id: dict[str, int], task: str) -> list[int]:
    out = []
    for r in rows:
        if r[key] not in label2id:
            raise DataError(
                r["source_file"],
                r["source_line"],
                "unknown-label",
                f"task '{task}': label '{r[key]}' is not in its label map {list(label2id)}",
            )
        out.append(label2id[r[key]])
    return out


def align_token_labels(
    word_ids: list[int | None], tags: list[int], label_all: bool, b_to_i: dict[int, int]
) -> list[int]:
    """NER labels per sub-token: the word's tag on its first piece; the rest -100 (or I-X if label_all)."""
    labels = []
    prev = None
    for w in word_ids:
        if w is None:
            labels.append(IGNORE_INDEX)
        elif w != prev:
            labels.append(tags[w])
        else:
            labels.append(b_to_i.get(tags[w], tags[w]) if label_all else IGNORE_INDEX)
        prev = w
    return labels


def qa_features(enc: Any, rows: list[dict[str, Any]], task: str) -> dict[str, list[Any]]:
    """Windows of (question, context) with start/end token positions; CLS (0) when the answer is outside.

    Follows the HF ``run_qa`` recipe: ``overflow_to_sample_mapping`` ties each window to its
    example, offsets are kept for context tokens only (-1 elsewhere) to map predictions back.
    """
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "input_ids",
            "token_type_ids",
            "offset_start",
            "offset_end",
            "example_id",
            "start_positions",
            "end_positions",
        )
    }
    for i in range(len(enc["input_ids"])):
        row = rows[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        offsets = enc["offset_mapping"][i]
        ctx = [j for j, s in enumerate(seq) if s == 1]
        start_tok = end_tok = 0
        if row["answer_starts"]:
            a_start = int(row["answer_starts"][0])
            a_end = a_start + len(row["answer_texts"][0])
            if a_start < 0 or a_end > len(row["context"]) or not row["answer_texts"][0]:
                raise DataError(
                    row["source_file"],
                    row["source_line"],
                    "answer-outside-context",
                    f"task '{task}': answer [{a_start}, {a_end}) lies outside its context of {len(row['context'])} characters",
                )
            if ctx and offsets[ctx[0]][0] <= a_start and offsets[ctx[-1]][1] >= a_end:
                start_tok = next(j for j in ctx if offsets[j][1] > a_start)
                end_tok = next(j for j in reversed(ctx) if offsets[j][0] < a_end)
        cols["input_ids"].append(enc["input_ids"][i])
        cols["token_type_ids"].append(enc["token_type_ids"][i])
        cols["offset_start"].append([o[0] if s == 1 else -1 for o, s in zip(offsets, seq, strict=True)])
        cols["offset_end"].append([o[1] if s == 1 else -1 for o, s in zip(offsets, seq, strict=True)])
        cols["example_id"].append(row["id"])
        cols["start_positions"].append(start_tok)
        cols["end_positions"].append(end_tok)
    return cols


def encode_task_split(
    tok: Any, meta: dict[str, Any], rows: list[dict[str, Any]], tc: TokenizeConfig
) -> dict[str, list[Any]]:
    """Model inputs for one task split, by head type (batch encode, never one text at a time)."""
    name, kind, labels = meta["name"], meta["type"], meta["labels"]
    label2id = {lbl: i for i, lbl in enumerate(labels)}
    L = tc.max_seq_length
    if kind == "sequence_classification":
        enc = tok([r["text"] for r in rows], truncation=True, max_length=L)
        return {
            "id": [r["id"] for r in rows],
            "input_ids": enc["input_ids"],
            "labels": _label_ids(rows, "label", label2id, name),
        }
    if kind == "pair_classification":
        enc = tok(
            [r["text"] for r in rows],
            [r["text_pair"] for r in rows],
            truncation="longest_first",
            max_length=L,
            return_token_type_ids=True,
        )
        return {
            "id": [r["id"] for r in rows],
            "input_ids": enc["input_ids"],
            "token_type_ids": enc["token_type_ids"],
            "labels": _label_ids(rows, "label", label2id, name),
        }
    if kind == "token_classification":
        tags = []
        for r in rows:
            unknown = [t for t in r["tags"] if t not in label2id]
            if unknown:
                raise DataError(
                    r["source_file"],
                    r["source_line"],
                    "unknown-label",
                    f"task '{name}': tag '{unknown[0]}' is not in its label map {shorten(labels)}",
                )
            tags.append([label2id[t] for t in r["tags"]])
        b_to_i = {
            label2id[t]: label2id["I-" + t[2:]] for t in labels if t.startswith("B-") and "I-" + t[2:] in label2id
        }
        enc = tok([list(r["tokens"]) for r in rows], is_split_into_words=True, truncation=True, max_length=L)
        word_ids = [enc.word_ids(i) for i in range(len(rows))]
        aligned = [align_token_labels(word_ids[i], tags[i], tc.label_all_tokens, b_to_i) for i in range(len(rows))]
        return {
            "id": [r["id"] for r in rows],
            "input_ids": enc["input_ids"],
            "labels": aligned,
            "word_ids": [[-1 if w is None else w for w in ids] for ids in word_ids],
        }  # to score per word, not per piece
    enc = tok(
        [r["question"] for r in rows],
        [r["context"] for r in rows],
        truncation="only_second",
        max_length=L,
        stride=tc.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        return_token_type_ids=True,
    )
    return qa_features(enc, rows, name)


def tokenize_tasks(tok: Any, tasks_dir: Path, out_dir: Path, tc: TokenizeConfig) -> dict[str, Any]:
    """Every task split to ``<out_dir>/<task>/<split>.arrow``, plus ``tasks.json``."""
    stats: dict[str, Any] = {}
    metas = []
    for task_dir in sorted(p for p in tasks_dir.iterdir() if (p / "task.json").exists()):
        meta = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))
        metas.append(meta)
        (out_dir / meta["name"]).mkdir(parents=True)
        stats[meta["name"]] = {}
        for split in ("train", "validation", "test"):
            rows = pq.read_table(task_dir / f"{split}.parquet").to_pylist()
            cols = encode_task_split(tok, meta, rows, tc) if rows else {"input_ids": []}
            table = pa.table(cols)
            with (
                pa.OSFile(str(out_dir / meta["name"] / f"{split}.arrow"), "wb") as sink,
                pa.ipc.new_stream(sink, table.schema) as w,
            ):
                w.write_table(table)
            lengths = [len(x) for x in cols["input_ids"]]
            stats[meta["name"]][split] = {
                "examples": len(rows),
                "features": len(lengths),
                "truncated": sum(n >= tc.max_seq_length for n in lengths) if meta["type"] != "extractive_qa" else None,
                "mean_tokens": round(float(np.mean(lengths)), 1) if lengths else 0.0,
            }
    write_json(out_dir / "tasks.json", metas)
    return stats
