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
from pipeline.core.io import data_digest, read_report, require_inputs, transaction
from pipeline.core.paths import Paths
from pipeline.core.sections.tokenize import TokenizeConfig
from pipeline.modelling.blocks import WordSegmenter, pack_texts, write_sentence_pairs
from pipeline.modelling.models import load_tokenizer, max_positions
from pipeline.tasks.encoding import iter_task_text_batches, tokenize_tasks
from pipeline.text.readers import iter_corpus_batches
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


def pack_corpus(tok: Any, paths: Paths, out: Path, tc: TokenizeConfig, segmenter: Any) -> dict[str, Any]:
    """The corpus's train and validation splits packed into ``out/<split>.arrow``; per split what was packed."""
    out.mkdir()
    return {
        split: pack_texts(
            tok, iter_corpus_batches(paths.corpus, split, tc.batch_docs), out / f"{split}.arrow", tc, segmenter
        )
        for split in ("train", "validation")
    }


def run(cfg: Config, paths: Paths, require_validation: bool = True) -> dict[str, Any]:
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
        corpus = pack_corpus(tok, paths, blocks_dir, tc, segmenter)
        timings["pack_s"] = time.perf_counter() - t0
        # the tasks' own train inputs, packed alike: pretraining adds them with pretrain.task_text (TAPT)
        task_text = pack_texts(
            tok,
            iter_task_text_batches(paths.tasks, tc.batch_docs),
            blocks_dir / "task_text.arrow",
            tc,
            segmenter,
        )
        if tc.sentence_pairs:
            for split in ("train", "validation"):
                pairs = blocks_dir / f"{split}_pairs.arrow"
                corpus[split].update(write_sentence_pairs(tok, paths.corpus, split, pairs, tc, cfg.seed))
        t0 = time.perf_counter()
        task_settings = dict(cfg.finetune.tasks)  # a task not listed is truncated (the default)
        tasks = tokenize_tasks(tok, paths.tasks, tasks_dir, tc, task_settings)
        if mined:  # the un-adapted baseline is fine-tuned with the vocab it was trained with
            base.save_pretrained(data_dir / "baseline" / "tokenizer")
            tokenize_tasks(base, paths.tasks, data_dir / "baseline" / "tasks", tc, task_settings)
        timings["tasks_s"] = time.perf_counter() - t0
        report = tokenize_report(
            tc,
            tok,
            base,
            {"corpus": corpus, "task_text": task_text, "tasks": tasks},
            fragmentation(base, tok, counts, terms or [m["token"] for m in mined]),
            mined,
            timings,
            task_settings,
        )
        txn.write_report(paths.tokenize_report, report)
    return report


def tokenize_report(
    tc: TokenizeConfig,
    tok: Any,
    base: Any,
    packed: dict[str, Any],
    frag: dict[str, Any],
    mined: list[dict[str, Any]],
    timings: dict[str, float],
    task_settings: dict[str, Any],
) -> dict[str, Any]:
    """reports/tokenize.json: the vocabulary, what was packed (corpus, TAPT text, tasks), fragmentation, speed."""
    corpus, task_text, tasks = packed["corpus"], packed["task_text"], packed["tasks"]
    total_tokens = sum(c["tokens"] for c in corpus.values())
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


def summary(r: dict[str, Any], cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline tokenize`` (what ``run`` returned, read for a person)."""
    f = r["fragmentation"]
    return (
        f"{r['mode']} vocab of {r['vocab_size']} ({r['new_tokens']} new tokens){', word ids' if r['whole_word'] else ''}; "
        f"{r['tokens']} tokens -> {r['blocks']} blocks of <= {cfg.tokenize.max_seq_length}; [UNK] share {r['unk_share']:.4%}\n"
        f"pieces per word {f['pieces_per_word_base']} -> {f['pieces_per_word_final']}, "
        f"per domain-term word {f['pieces_per_domain_word_base']} -> {f['pieces_per_domain_word_final']}\n"
        + "".join(
            f"{task}: long texts as windows, {sum(s['features'] for s in r['tasks'][task].values())} windows for "
            f"{sum(s['examples'] for s in r['tasks'][task].values())} examples\n"
            for task in r.get("long_text", {})
        )
        + (f"warning: {r['warning']}\n" if "warning" in r else "")
        + f"{r['pack_tokens_per_s']} tokens/s; report: {paths.tokenize_report}"
    )
