"""select: kNN corpus selection (pretrain.selection), its embedding cache, and pretrain on the chosen blocks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.core.errors import DataError
from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.models import resolve_base
from pipeline.modelling.precision import resolve_precision
from pipeline.modelling.selection import Embedder, EmbeddingCache, RunningTopK, select_nearest
from pipeline.stages import pretrain, select, tokenize
from tests.conftest import TINY_PRETRAIN, copy_project, make_config

NEAREST = {"pretrain.selection.mode": "nearest", "pretrain.selection.k": 2}


def test_running_top_k_equals_the_full_sort() -> None:
    """Streaming shards of random unit vectors gives each query the same k best as sorting the whole matrix."""
    rng = np.random.default_rng(0)
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    queries, corpus = unit(rng.normal(size=(37, 16))).astype(np.float32), unit(rng.normal(size=(250, 16)))
    top = RunningTopK(queries, k=5)
    for start in range(0, 250, 64):  # shards of 64, the last one short
        top.update(corpus[start : start + 64], start)
    sims = queries @ corpus.T.astype(np.float32)
    expected = np.argsort(-sims, axis=1, kind="stable")[:, :5]
    assert np.array_equal(top.index, expected)
    assert np.allclose(top.scores, np.take_along_axis(sims, expected, axis=1), atol=1e-5)
    assert top.mean_similarity() == pytest.approx(float(sims.mean()), abs=1e-5)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(resolve_base("minilm", "x"), resolve_precision("fp32"), batch_size=8)


TOPICS = [
    "the patient was given aspirin for a severe headache after surgery",
    "quarterly revenue rose sharply as the bank cut its interest rates",
    "the striker scored twice in the second half of the cup final",
    "a volcano erupted on the island and ash covered the nearby villages",
]
FILLER = [f"item number {i} in the warehouse inventory list is a wooden chair" for i in range(40)]


def test_each_query_finds_its_planted_copy_even_through_another_vocabulary(
    embedder: Embedder, tmp_path, project
) -> None:
    """A corpus of filler with a re-worded copy of every query planted in it: each query's nearest block is its copy,
    through the embedder's own tokenizer and through the pipeline's extended one (decoded, re-encoded)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    cfg, paths = project
    tokenize.run(cfg, paths)
    planted = {7: 0, 19: 1, 23: 2, 35: 3}  # corpus row -> the query it copies
    rows = list(FILLER)
    for row, q in planted.items():
        rows.insert(row, TOPICS[q].upper().replace(" the ", " that "))  # re-cased, a word changed
    queries = embedder.embed_texts(TOPICS)
    for name, tok in [("embedder's", embedder.tokenizer), ("extended", AutoTokenizer.from_pretrained(paths.tokenizer))]:
        blocks = Dataset.from_dict({"input_ids": tok(rows)["input_ids"]})
        chosen = select_nearest(blocks, queries, 3, tok, name, embedder, EmbeddingCache(tmp_path / name))
        assert {int(chosen.neighbours[q, 0]): q for q in range(4)} == planted, name
        assert (chosen.scores[:, 0] > 0.8).all() and chosen.mean_similarity < 0.3, name
        assert len(chosen.blocks) <= 12 and set(planted) <= set(chosen.blocks.tolist())


@pytest.fixture(scope="module")
def nearest_selected(built_demo, tmp_path_factory: pytest.TempPathFactory) -> tuple[Paths, dict]:
    """The small demo project after tokenize and a nearest selection (embedding the corpus and the queries: the slow
    part, once); 30 train inputs per task are the queries (all of them took as long again as the corpus)."""
    import pyarrow.parquet as pq

    _, src = built_demo
    paths = copy_project(src, tmp_path_factory.mktemp("selected"))
    tokenize.run(make_config(), paths)
    for train in paths.tasks.glob("*/train.parquet"):
        pq.write_table(pq.read_table(train).slice(0, 30), train)
    return paths, select.run(make_config(**NEAREST), paths)


def test_nearest_selection_is_cached_and_reproducible(nearest_selected, tmp_path) -> None:
    paths, first = copy_project(nearest_selected[0], tmp_path), nearest_selected[1]
    cfg = make_config(**NEAREST)
    blocks = np.load(paths.selection / "blocks.npy")
    assert first.cache.embedded >= 2 and first.cache.hits == 0  # the queries, and each corpus shard
    assert 0 < first.selected_blocks == len(blocks) < first.corpus_blocks
    assert np.array_equal(blocks, np.unique(blocks))
    assert first.selected_tokens < first.corpus_tokens
    assert set(first.tasks) == {"ner", "pair", "qa", "role"}
    for task, t in first.tasks.items():  # a task's nearest blocks are nearer than a random one
        assert 0 < t.blocks <= 2 * t.train_inputs, task
        assert t.mean_top1_cosine >= t.mean_kth_cosine > first.mean_random_cosine, task
    assert json.loads(paths.select_report.read_text())["selected_blocks"] == len(blocks)

    again = select.run(cfg, paths)  # same corpus: nothing embedded, the same blocks
    assert again.cache.embedded == 0 and again.cache.hits == first.cache.embedded
    assert np.array_equal(np.load(paths.selection / "blocks.npy"), blocks)

    wider = select.run(make_config(**{**NEAREST, "pretrain.selection.k": 6}), paths)  # a new k: still nothing embedded
    assert wider.cache.embedded == 0 and wider.selected_blocks > first.selected_blocks


def test_mode_all_embeds_nothing_and_pretrain_uses_every_block(project) -> None:
    cfg, paths = project
    tokenize.run(cfg, paths)
    report = select.run(cfg, paths)
    assert report.as_json() == {
        "mode": "all",
        "corpus_blocks": report.corpus_blocks,
        "corpus_tokens": report.corpus_tokens,
    }
    assert not (paths.selection / "blocks.npy").exists() and not list(paths.embeddings.glob("*.npy"))
    # the cache folder (a DVC output) is not empty: DVC warned "'data/embeddings' is empty" on every default run
    assert [p.name for p in paths.embeddings.iterdir()] == ["README.md"]
    assert (paths.embeddings / "README.md").read_text(encoding="utf-8") == select.EMBEDDINGS_README
    trained = pretrain.run(make_config(**TINY_PRETRAIN), paths)
    assert trained.train_blocks == report.corpus_blocks and trained.selection is None


def test_pretrain_trains_on_the_selection_and_refuses_a_stale_one(nearest_selected, tmp_path) -> None:
    paths, chosen = copy_project(nearest_selected[0], tmp_path), nearest_selected[1]
    cfg = make_config(**TINY_PRETRAIN, **NEAREST)
    trained = pretrain.run(cfg, paths)
    assert trained.train_blocks == chosen.selected_blocks < chosen.corpus_blocks
    assert trained.selection is not None and trained.selection.selected_blocks == chosen.selected_blocks

    record = paths.selection / "selection.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "corpus_blocks": 3}))  # made for another corpus
    with pytest.raises(DataError, match=r"stale-selection.*made for 3 blocks.*run the select stage"):
        pretrain.run(cfg, paths)


def test_the_knn_tapt_arm_has_select_choose_and_trains_on_its_blocks_and_the_task_text(
    nearest_selected, tmp_path
) -> None:
    """``adapt.strategy: auto`` with the ``nearest+tapt`` arm: select computes the nearest blocks though
    ``pretrain.selection.mode`` stays ``all`` (from the cache: nothing embedded again), and the arm pretrains on them
    plus the tasks' train inputs, with ``pretrain.selection``'s ``k``."""
    from pipeline.training.tournament import Arena, pretrain_arm

    paths, chosen = copy_project(nearest_selected[0], tmp_path / "project"), nearest_selected[1]
    cfg = make_config(
        **TINY_PRETRAIN,
        **{"pretrain.selection.k": 2, "adapt.strategy": "auto", "adapt.arms": ["none", "dapt", "nearest+tapt"]},
        **{"adapt.first_rung": {"pretrain_minutes": 0.02, "finetune_steps": 12}},
    )
    assert cfg.pretrain.selection.mode == "all" and cfg.adapt.needs_selection()
    report = select.run(cfg, paths)
    assert report.mode == "nearest" and report.used_for == "adapt.arms: nearest+tapt"
    assert report.cache.embedded == 0 and report.selected_blocks == chosen.selected_blocks
    assert "per train input (adapt.arms: nearest+tapt):" in select.summary(report, cfg, paths)

    arena = Arena(cfg, paths, tmp_path / "work", resolve_precision("fp32"))
    pretrain_arm(arena, "nearest+tapt", 0)
    trained = read_report(Paths(arena.folder("nearest+tapt", 0)).pretrain_report, PretrainReport)
    assert trained.selection is not None
    assert (trained.selection.k, trained.selection.selected_blocks) == (2, chosen.selected_blocks)
    assert trained.train_blocks == chosen.selected_blocks + trained.task_text_blocks
    assert trained.task_text_blocks > 0 and trained.global_step > 0
    pretrain_arm(arena, "dapt", 0)  # the corpus arm beside it still reads every block
    dapt = read_report(Paths(arena.folder("dapt", 0)).pretrain_report, PretrainReport)
    assert dapt.train_blocks == chosen.corpus_blocks and dapt.selection is None


def test_pretrain_in_nearest_mode_without_a_selection_names_the_stage(project) -> None:
    cfg, paths = project
    tokenize.run(cfg, paths)
    with pytest.raises(DataError, match=r"select"):
        pretrain.run(make_config(**TINY_PRETRAIN, **NEAREST), paths)


def test_select_is_a_stage_of_the_flow_and_the_dag() -> None:
    import yaml

    from pipeline.core.stages import NAMES as STAGES
    from tests.conftest import ROOT

    assert STAGES.index("tokenize") < STAGES.index("select") < STAGES.index("pretrain")
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "data/selection" in stages["pretrain"]["deps"]
    assert {"pretrain.selection", "precision"} <= set(stages["select"]["params"])
