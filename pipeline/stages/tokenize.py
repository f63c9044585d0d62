"""tokenize stage: the tokenizer, packed pretraining blocks and tokenized task splits.

Vocabulary (``tokenize.mode``): the base model's WordPiece vocab, optionally extended with
mined domain words (``extend_vocab``), or a new WordPiece vocab trained on the corpus
(``wordpiece_scratch``). With ``whole_word: true`` every pretraining token also carries the id
of the word it belongs to: English words from the BERT pre-tokenizer, Chinese words from jieba
(transformers' offset-based whole-word masking would treat a run of Chinese characters as one
word). Corpus documents are encoded in batches by the Rust tokenizer, joined with ``[SEP]`` and
cut into ``[CLS] ... [SEP]`` blocks of ``max_seq_length`` tokens: no padding, every token kept.
Outputs are Arrow IPC stream files that ``datasets.Dataset.from_file`` memory-maps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.core.config import Config
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import data_digest, file_digest, read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.reports.tokenize import TokenizeReport
from pipeline.core.sections.tokenize import TokenizeConfig
from pipeline.modelling.blocks import WordSegmenter, pack_texts, write_shard
from pipeline.modelling.models import load_tokenizer, max_positions
from pipeline.modelling.shards import (
    CORPUS_GROUPS,
    TASK_TEXT,
    ShardJob,
    ShardRecord,
    corpus_shard_plan,
    shard_file,
    write_manifest,
)
from pipeline.tasks.encoding import iter_task_text_batches, tokenize_tasks
from pipeline.text.corpus_shards import iter_corpus_batches
from pipeline.text.vocab import build_tokenizer, count_words, fragmentation, read_terms

# Above this share of [UNK] corpus tokens the vocabulary does not cover the text (BERT's English vocabularies
# on real English text stay far below 0.1%; all-MiniLM-L6-v2's on Chinese news gives ~62%).
UNK_WARN_SHARE = 0.01


def check_positions(tc: TokenizeConfig) -> None:
    if tc.mode == "wordpiece_scratch":
        return  # the model is built later from params; pretrain checks its own limit
    limit = max_positions(tc.base_tokenizer, "tokenize.base_tokenizer")
    if limit is not None and tc.max_seq_length > limit:
        raise ConfigError(
            f"tokenize.max_seq_length={tc.max_seq_length} exceeds the position limit of the base model "
            f"'{tc.base_tokenizer}' (max_position_embeddings={limit})"
        )


def require_validated(paths: Paths) -> None:
    """The data must be exactly what the validate stage passed (``reports/validated.json``'s digest)."""
    require_inputs(paths.corpus, paths.tasks)
    stamp = read_report(paths.validated_stamp)
    if stamp.get("data_sha256") != data_digest([paths.corpus, paths.tasks]):
        raise DataError(
            paths.validated_stamp,
            None,
            "not-validated",
            "data/corpus or data/tasks changed since they passed validation (or the last validation failed); "
            "run `dvc repro validate` (or `python -m pipeline validate`) first",
        )


def shard_jobs(paths: Paths, tc: TokenizeConfig) -> list[ShardJob]:
    """The corpus shards to write: blocks of each split (and their sentence pairs), one per run of row groups."""
    kinds = ("blocks", "pairs") if tc.sentence_pairs else ("blocks",)
    return [
        ShardJob(kind, split, index, corpus_file, row_groups)
        for kind in kinds
        for split in CORPUS_GROUPS
        for index, (corpus_file, row_groups) in enumerate(corpus_shard_plan(paths.corpus, split, tc.shard_docs))
    ]


def pack_corpus(
    cfg: Config, tok: Any, tok_dir: Path, paths: Paths, out: Path
) -> tuple[dict[str, Any], list[ShardRecord], dict[str, Any] | None]:
    """The corpus's train and validation splits as shards under ``out`` (blocks, and sentence pairs when asked), on
    the chosen engine; per split what was packed, the manifest lines, and the Ray cluster used (``None``: local)."""
    tc = cfg.tokenize
    jobs = shard_jobs(paths, tc)
    cluster = None
    if tc.engine == "ray":
        from pipeline.modelling.blocks_ray import write_shards_on_ray  # imports Ray: only when that engine is chosen

        results, cluster = write_shards_on_ray(tok_dir, paths.corpus, jobs, out, tc, cfg.ray, cfg.seed)
    else:
        results = [write_shard(tok, paths.corpus, job, out, tc, cfg.seed) for job in jobs]
    totals: dict[str, Any] = {split: {"shards": 0} for split in CORPUS_GROUPS}
    for job, (_, counts) in zip(jobs, results, strict=True):
        split = totals[job.split]
        if job.kind == "pairs":
            split["pairs"] = split.get("pairs", 0) + counts["pairs"]
            continue
        split["shards"] += 1
        for key, value in counts.items():
            split[key] = split.get(key, 0) + value
    return totals, [record for record, _ in results], cluster


def run(cfg: Config, paths: Paths, require_validation: bool = True) -> TokenizeReport:
    """Build the tokenizer, pack the corpus, tokenize the tasks; write ``reports/tokenize.json``.

    ``require_validation=False`` is for callers that tokenize data they derived or generated
    themselves (benchmarks, the study's TAPT corpus); the stage itself always checks.
    """
    tc = cfg.tokenize
    if require_validation:
        require_validated(paths)
    check_positions(tc)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    base = load_tokenizer(tc.base_tokenizer, "tokenize.base_tokenizer")
    segmenter = WordSegmenter(tc.language, tc.jieba_user_dict) if tc.whole_word else None
    terms = read_terms(tc.domain_terms, paths.root)
    counts = count_words(base, iter_corpus_batches(paths.corpus, "train", tc.batch_docs, tc.mining_max_docs))
    timings["count_words_s"] = time.perf_counter() - start
    with transaction(paths.root, "tokenize") as txn:
        tok_dir, data_dir = txn.dir(paths.tokenizer), txn.dir(paths.tokenized)
        blocks_dir, tasks_dir = data_dir / paths.pretrain_blocks.name, data_dir / paths.task_features.name
        t0 = time.perf_counter()
        tok, mined = build_tokenizer(tc, paths, base, counts, tok_dir)
        timings["build_tokenizer_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        corpus, shards, cluster = pack_corpus(cfg, tok, tok_dir, paths, blocks_dir)
        timings["pack_s"] = time.perf_counter() - t0
        # the tasks' own train inputs, packed alike: pretraining adds them with pretrain.task_text (TAPT)
        task_file = blocks_dir / shard_file(TASK_TEXT, 0)
        task_file.parent.mkdir(parents=True)
        task_text = pack_texts(tok, iter_task_text_batches(paths.tasks, tc.batch_docs), task_file, tc, segmenter)
        shards.append(
            ShardRecord(
                TASK_TEXT, shard_file(TASK_TEXT, 0), task_text["blocks"], task_text["tokens"], file_digest(task_file)
            )
        )
        write_manifest(blocks_dir, shards)
        t0 = time.perf_counter()
        task_settings = dict(cfg.finetune.tasks)  # a task not listed is truncated (the default)
        tasks = tokenize_tasks(tok, paths.tasks, tasks_dir, tc, task_settings)
        if mined:  # the un-adapted baseline is fine-tuned with the vocab it was trained with
            base.save_pretrained(data_dir / "baseline" / "tokenizer")
            tokenize_tasks(base, paths.tasks, data_dir / "baseline" / "tasks", tc, task_settings)
        timings["tasks_s"] = time.perf_counter() - t0
        fields = tokenize_report(
            cfg,
            tok,
            base,
            {"corpus": corpus, "task_text": task_text, "tasks": tasks},
            fragmentation(base, tok, counts, terms or [m["token"] for m in mined]),
            mined,
            timings,
            task_settings,
        )
        if cluster is not None:  # only then, so a local run writes the report it always did
            fields["engine"], fields["engine_cluster"] = tc.engine, cluster
        report = TokenizeReport.model_validate(fields)  # only the keys set above are written
        txn.write_report(paths.tokenize_report, report)
    return report


def tokenize_report(
    cfg: Config,
    tok: Any,
    base: Any,
    packed: dict[str, Any],
    frag: dict[str, Any],
    mined: list[dict[str, Any]],
    timings: dict[str, float],
    task_settings: dict[str, Any],
) -> dict[str, Any]:
    """reports/tokenize.json: the vocabulary, what was packed (corpus, TAPT text, tasks), fragmentation, speed."""
    tc = cfg.tokenize
    corpus, task_text, tasks = packed["corpus"], packed["task_text"], packed["tasks"]
    total_tokens = sum(c["tokens"] for c in corpus.values())
    shards = sum(c["shards"] for c in corpus.values())
    report = {
        "mode": tc.mode,
        "whole_word": tc.whole_word,
        "language": tc.language,
        "vocab_size": len(tok),
        "base_vocab_size": len(base),
        "corpus": corpus,
        "task_text": task_text,
        "tokens": total_tokens,
        "blocks": sum(c["blocks"] for c in corpus.values()),
        "shards": shards,
        "unk_share": round(sum(c["unk_tokens"] for c in corpus.values()) / max(total_tokens, 1), 6),
        "fragmentation": frag,
        "new_tokens": len(mined),
        "top_new_tokens": [{k: m[k] for k in ("token", "frequency", "base_pieces")} for m in mined[:20]],
        "tasks": tasks,
        "seconds": {k: round(v, 2) for k, v in timings.items()},
        "pack_tokens_per_s": round(total_tokens / max(timings["pack_s"], 1e-9)),
        "pack_mb_per_s": round(sum(c["characters"] for c in corpus.values()) / 1e6 / max(timings["pack_s"], 1e-9), 2),
    }
    windowed = {n: t.long_text for n, t in sorted(task_settings.items()) if n in tasks and t.long_text != "truncate"}
    if windowed:  # only then, so a run without windows writes the report it always did
        report["long_text"] = windowed
    if (warning := coverage_warning(report["unk_share"], tc)) is not None:  # only then, as above
        report["warning"] = warning
    return report


def coverage_warning(unk_share: float, tc: TokenizeConfig) -> str | None:
    """What to change when the vocabulary leaves more than ``UNK_WARN_SHARE`` of the corpus as ``[UNK]``."""
    if unk_share <= UNK_WARN_SHARE:
        return None
    fixes = (
        "a base model whose vocabulary covers this text (tokenize.base_tokenizer and pretrain.base_model), or train "
        "a vocabulary on the corpus (tokenize.mode: wordpiece_scratch, as profiles/zh.yaml does)"
        if tc.mode == "wordpiece"
        else "a larger tokenize.scratch.vocab_size or a lower tokenize.scratch.min_frequency"
    )
    return (
        f"{unk_share:.1%} of the corpus tokens are [UNK] (over {UNK_WARN_SHARE:.0%}): the {tc.mode} vocabulary does "
        f"not cover this text (another language or script?), and the model reads each of them as the same symbol; "
        f"use {fixes}"
    )


def summary(r: TokenizeReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline tokenize`` (what ``run`` returned, read for a person)."""
    f = r.fragmentation
    return (
        f"{r.mode} vocab of {r.vocab_size} ({r.new_tokens} new tokens){', word ids' if r.whole_word else ''}; "
        f"{r.tokens} tokens -> {r.blocks} blocks of <= {cfg.tokenize.max_seq_length}; [UNK] share {r.unk_share:.4%}\n"
        f"pieces per word {f.pieces_per_word_base} -> {f.pieces_per_word_final}, "
        f"per domain-term word {f.pieces_per_domain_word_base} -> {f.pieces_per_domain_word_final}\n"
        + "".join(
            f"{task}: long texts as windows, {sum(s.features for s in r.tasks[task].values())} windows for "
            f"{sum(s.examples for s in r.tasks[task].values())} examples\n"
            for task in r.long_text or {}
        )
        + (f"warning: {r.warning}\n" if r.warning else "")
        + f"{r.pack_tokens_per_s} tokens/s; report: {paths.tokenize_report}"
    )
