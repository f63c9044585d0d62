"""select stage: which corpus blocks DAPT trains on (``pretrain.selection``) -> ``data/selection/``.

``all`` (the default) keeps every block and embeds nothing, unless the adapt stage's tournament has the
``nearest+tapt`` arm (``adapt.strategy: auto``), which trains on the nearest blocks: they are computed then.
``nearest`` embeds the corpus blocks and the tasks' train inputs with a sentence-embedding model and keeps each
train input's ``k`` nearest blocks (kNN-TAPT, Gururangan et al. 2020; :mod:`pipeline.modelling.selection`);
pretrain then trains on that union only. The embeddings are cached per content hash in ``data/embeddings/`` (kept between
runs), so changing ``k`` or re-running on the same corpus embeds nothing. ``reports/select.json``
says how many blocks and tokens were chosen, for which task, and how near they are.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.config import Config
from pipeline.core.io import file_digest, require_inputs, transaction, write_text
from pipeline.core.paths import Paths
from pipeline.core.reports.select import SelectReport
from pipeline.modelling.models import resolve_base
from pipeline.modelling.precision import resolve_precision
from pipeline.modelling.selection import Embedder, EmbeddingCache, per_task_overlap, select_nearest
from pipeline.modelling.shards import MANIFEST, open_group
from pipeline.tasks.encoding import task_train_inputs

SELECTION_FILE = "selection.json"
BLOCKS_FILE = "blocks.npy"


def corpus_size(blocks: Any) -> tuple[int, int]:
    """``(blocks, tokens)`` of a memory-mapped blocks dataset, from the Arrow list lengths (no rows read)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(blocks.data.column("input_ids"))
    return len(blocks), int(pc.sum(lengths).as_py() or 0)


def embed_queries(tasks_dir: Any, embedder: Embedder, cache: EmbeddingCache) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors of every task's distinct train inputs, and the task of each row."""
    pairs = list(task_train_inputs(tasks_dir))
    texts = [t for _, t in pairs]
    digest = hashlib.sha256(f"queries:{embedder.fingerprint}".encode())
    for task, text in pairs:
        digest.update(f"{task}\x00{text}\x01".encode())
    vectors = cache.get(digest.hexdigest()[:32], lambda: embedder.embed_texts(texts))
    return vectors.astype(np.float32), np.asarray([task for task, _ in pairs])


EMBEDDINGS_README = (
    "The embedding cache of `pretrain.selection.mode: nearest`: one .npy per corpus shard and per task's train\n"
    "inputs, named by the content, tokenizer and embedder they were computed from. Kept between runs (DVC\n"
    "persist); a run removes the files it did not use. Empty in mode `all`.\n"
)


def describe_embedding_cache(folder: Path) -> None:
    """Create the cache folder with its README: a DVC output, and DVC warns about an empty one on every run."""
    folder.mkdir(parents=True, exist_ok=True)
    readme = folder / "README.md"
    if not readme.exists() or readme.read_text(encoding="utf-8") != EMBEDDINGS_README:
        write_text(readme, EMBEDDINGS_README)  # atomic: a killed run leaves the old README or the new one


def run(cfg: Config, paths: Paths) -> SelectReport:
    """Choose the DAPT blocks; write ``data/selection/`` and ``reports/select.json``."""
    sc = cfg.pretrain.selection
    require_inputs(paths.pretrain_blocks / MANIFEST, paths.tokenizer, paths.tasks)
    start = time.perf_counter()
    blocks, _ = open_group(paths.pretrain_blocks, "train")
    n_blocks, n_tokens = corpus_size(blocks)
    found: dict[str, Any] = {"mode": sc.mode, "corpus_blocks": n_blocks, "corpus_tokens": n_tokens}
    chosen = None
    describe_embedding_cache(paths.embeddings)  # a DVC output in either mode; mode all adds no embedding to it
    if sc.mode == "nearest" or cfg.adapt.needs_selection():
        from transformers import AutoTokenizer

        precision = resolve_precision(cfg.precision)
        embedder = Embedder(resolve_base(sc.embedder, "pretrain.selection.embedder"), precision, sc.batch_size)
        cache = EmbeddingCache(paths.embeddings)
        queries, query_tasks = embed_queries(paths.tasks, embedder, cache)
        tok = AutoTokenizer.from_pretrained(paths.tokenizer)
        chosen = select_nearest(
            blocks, queries, sc.k, tok, file_digest(paths.tokenizer / "tokenizer.json"), embedder, cache
        )
        selected_tokens = int(chosen.lengths[chosen.blocks].sum())
        seconds = time.perf_counter() - start
        found |= {
            "mode": "nearest",
            # who trains on it: DAPT in the pretrain stage, or only the tournament's kNN-TAPT arm
            "for": "pretrain.selection.mode: nearest" if sc.mode == "nearest" else "adapt.arms: nearest+tapt",
            "k": sc.k,
            "embedder": sc.embedder,
            **precision.as_report(),
            "train_inputs": len(queries),
            "selected_blocks": len(chosen.blocks),
            "selected_tokens": selected_tokens,
            "selected_token_share": round(selected_tokens / max(n_tokens, 1), 4),
            "tasks": per_task_overlap(chosen, query_tasks),
            "mean_random_cosine": round(chosen.mean_similarity, 4),  # a query and an unselected block, on average
            "cache": {"hits": chosen.cache_hits, "embedded": chosen.cache_misses, "removed": chosen.cache_pruned},
            "seconds": round(seconds, 1),
            "blocks_per_s": round(n_blocks / max(seconds, 1e-9)),
        }
    report = SelectReport.model_validate(found)
    with transaction(paths.root, "select") as txn:
        out = txn.dir(paths.selection)
        record = report.model_dump(include={"mode", "corpus_blocks", "k", "selected_blocks"}, exclude_unset=True)
        (out / SELECTION_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if chosen is not None:
            np.save(out / BLOCKS_FILE, chosen.blocks)
        txn.write_report(paths.select_report, report)
    return report


def summary(r: SelectReport, cfg: Config, paths: Paths) -> str:
    """The console lines of ``python -m pipeline select`` (what ``run`` returned, read for a person)."""
    if r.mode == "all" or r.tasks is None or r.cache is None:
        return f"all {r.corpus_blocks:,} corpus blocks ({r.corpus_tokens:,} tokens) go to DAPT; report: {paths.select_report}"
    near = ", ".join(f"{task} {t.mean_top1_cosine}" for task, t in r.tasks.items())
    c = r.cache
    user = f" ({r.used_for})" if "nearest+tapt" in (r.used_for or "") else ""
    return (
        f"nearest {r.k} blocks per train input{user}: {r.selected_blocks:,} of {r.corpus_blocks:,} blocks, "
        f"{r.selected_tokens:,} tokens ({r.selected_token_share:.1%} of the corpus) for {r.train_inputs:,} "
        f"train inputs\nmean cosine of the nearest block: {near}; of a random block: {r.mean_random_cosine}\n"
        f"embeddings: {c.embedded} files computed, {c.hits} read from {paths.embeddings} ({r.blocks_per_s} blocks/s, "
        f"{r.precision}); selection: {paths.selection}; report: {paths.select_report}"
    )
