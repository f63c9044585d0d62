"""The error analysis: each task type's mistakes on hand-made answers, and the evaluate stage's errors.json and
predictions files checked against its own metrics."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pipeline.core.base_model import NO_MLM_HEAD
from pipeline.core.io import check_json_seal, read_report
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.reporting.evaluation import error_markdown
from pipeline.reporting.html import errors_section
from pipeline.reporting.numbers import points
from pipeline.tasks.registry import kind_of
from pipeline.tasks.spec import TaskSpec


def _spec(type_: str, labels: list[str]) -> TaskSpec:
    from pipeline.core.sections.finetune import FinetuneTaskConfig

    return TaskSpec(name="t", type=type_, labels=labels, settings=FinetuneTaskConfig())


NER_LABELS = ["O", "B-Drug", "I-Drug", "B-Disease", "I-Disease"]


def test_ner_mistakes_name_the_missed_the_spurious_and_the_wrongly_typed_entities() -> None:
    kind, spec = kind_of("token_classification"), _spec("token_classification", NER_LABELS)
    row = {"id": "s1", "tokens": ["aspirin", "eases", "heart", "attack", "in", "Oslo"], "tags": []}
    gold = ["B-Drug", "O", "B-Disease", "I-Disease", "O", "O"]
    pred = ["B-Disease", "O", "B-Disease", "O", "O", "B-Drug"]
    conf = [0.9, 0.99, 0.8, 0.6, 0.99, 0.7]
    m = kind.mistake(row, gold, pred, conf, spec)
    assert m is not None
    assert m.gold == "Drug: aspirin; Disease: heart attack" and m.pred == "Disease: aspirin; Disease: heart; Drug: Oslo"
    # aspirin: a Drug called Disease; heart attack: no entity of that span; heart and Oslo: spurious
    assert sorted(m.confusions) == [("Disease", "O"), ("Drug", "Disease"), ("O", "Disease"), ("O", "Drug")]
    assert m.confidence == pytest.approx((0.9 + 0.8 + 0.6 + 0.7) / 4)  # the words of the wrong entities
    assert kind.mistake(row, gold, list(gold), conf, spec) is None
    assert kind.shown_answer(row, gold, spec) == "Drug: aspirin; Disease: heart attack"


def test_ner_seen_and_unseen_mentions_are_scored_apart() -> None:
    kind, spec = kind_of("token_classification"), _spec("token_classification", NER_LABELS)
    train = [{"tokens": ["Aspirin", "works"], "tags": ["B-Drug", "O"]}]
    rows = [{"tokens": ["aspirin", "and", "zorbex"], "tags": []}, {"tokens": ["zorbex", "again"], "tags": []}]
    gold = [["B-Drug", "O", "B-Drug"], ["B-Drug", "O"]]
    pred = [["B-Drug", "O", "O"], ["B-Drug", "B-Drug"]]
    split = kind.seen_unseen(train, rows, gold, pred, spec)
    assert split["seen"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "gold": 1, "predicted": 1}
    # unseen: zorbex twice in gold, found once; "again" predicted wrongly
    assert split["unseen"]["gold"] == 2 and split["unseen"]["predicted"] == 2
    assert split["unseen"]["recall"] == 0.5 and split["unseen"]["precision"] == 0.5


def test_classification_qa_multilabel_and_regression_mistakes() -> None:
    seq = kind_of("sequence_classification")
    spec = _spec("sequence_classification", ["neg", "pos"])
    m = seq.mistake({"text": "fine"}, 1, 0, 0.83, spec)
    assert (m.gold, m.pred, m.confidence, m.confusions) == ("pos", "neg", 0.83, (("pos", "neg"),))
    assert seq.mistake({"text": "fine"}, 1, 1, 0.83, spec) is None

    qa = kind_of("extractive_qa")
    qspec = _spec("extractive_qa", [])
    row = {"question": "What?", "context": "The dose was 20 mg."}
    assert qa.mistake(row, ["20 mg"], "20 mg.", 0.7, qspec) is None  # SQuAD normalisation: punctuation ignored
    m = qa.mistake(row, ["20 mg", "20 mg daily"], "dose", 0.7, qspec)
    assert (m.gold, m.pred, m.confidence) == ("20 mg | 20 mg daily", "dose", 0.7)
    assert qa.shown_input(row) == "What? || The dose was 20 mg."

    ml = kind_of("multilabel_classification")
    mspec = _spec("multilabel_classification", ["a", "b", "c"])
    m = ml.mistake({"text": "x"}, [1, 1, 0], [1, 0, 1], [0.9, 0.6, 0.8], mspec)
    assert (m.gold, m.pred, m.confusions) == ("b", "c", (("b", "-"), ("-", "c")))
    assert m.confidence == pytest.approx(0.7)

    reg = kind_of("regression")
    rspec = _spec("regression", [])
    assert reg.graded and reg.mistake({"text": "x"}, 3.0, 2.25, None, rspec).rank == 0.75


def test_text_from_the_data_is_no_markup_in_the_markdown_or_the_page() -> None:
    errors = {
        "role": {
            "type": "sequence_classification",
            "examples": 3,
            "graded": False,
            "adapted": {
                "wrong": 1,
                "confusions": [{"gold": "a|b", "pred": "c", "count": 1}],
                "mistakes": [
                    {"index": 0, "id": "x", "text": "<script>alert(1)</script> | x", "gold": "a|b", "pred": "c"}
                    | {"confidence": 0.9}
                ],
            },
        }
    }
    md = "\n".join(error_markdown(errors))
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt; \\| x" in md and "| a\\|b | c | 1 |" in md
    page = errors_section(errors)
    assert "<script>" not in page and "&lt;script&gt;" in page and "adapted wrong on 1 of 3" in page


def test_evaluate_writes_an_error_analysis_that_agrees_with_its_metrics(finetuned) -> None:
    _, paths, _, metrics = finetuned
    errors = check_json_seal(paths.errors, json.loads(paths.errors.read_text()))
    assert set(errors) == set(metrics.tasks)
    for name, task in metrics.tasks.items():
        e = errors[name]
        records = [json.loads(line) for line in (paths.predictions / f"{name}.jsonl").read_text().splitlines()]
        assert len(records) == task.test_examples == e["examples"]
        for model in ("adapted", "baseline"):
            wrong = sum(not r[f"{model}_correct"] for r in records)
            assert e[model]["wrong"] == wrong
            share_right = 1 - wrong / len(records)
            scores = task.scores(model) or {}
            if task.type in ("sequence_classification", "pair_classification"):
                assert scores["accuracy"] == pytest.approx(share_right, abs=1e-4)
            if task.type == "extractive_qa":
                assert scores["exact_match"] == pytest.approx(share_right, abs=1e-4)
            listed = e[model]["mistakes"]
            assert len(listed) == min(wrong, 5)
            assert all(0 <= m["confidence"] <= 1 for m in listed)
            assert [m["confidence"] for m in listed] == sorted((m["confidence"] for m in listed), reverse=True)
            if task.type in ("sequence_classification", "pair_classification"):  # one (gold, predicted) per error
                pairs = Counter((r["gold"], r[model]) for r in records if not r[f"{model}_correct"])
                assert sorted(c["count"] for c in e[model]["confusions"]) == sorted(
                    n for _, n in pairs.most_common(len(e[model]["confusions"]))
                )
                assert all(pairs[(c["gold"], c["pred"])] == c["count"] for c in e[model]["confusions"])
        right = {m: sum(r[f"{m}_correct"] for r in records) for m in ("adapted", "baseline")}
        assert e["changed"]["fixed"] - e["changed"]["broken"] == right["adapted"] - right["baseline"]
    ner = errors["ner"]["adapted"]["seen_unseen"]
    gold_entities = ner["seen"]["gold"] + ner["unseen"]["gold"]
    recall = (ner["seen"]["recall"] * ner["seen"]["gold"] + ner["unseen"]["recall"] * ner["unseen"]["gold"]) / max(
        gold_entities, 1
    )
    assert recall == pytest.approx(metrics.tasks["ner"].adapted["recall"], abs=1e-3)
    text = paths.evaluation.read_text()
    assert "## Error analysis (adapted model)" in text and "mentions seen in train vs unseen" in text


def test_the_verdict_gives_the_mean_gain_with_its_interval(finetuned) -> None:
    _, _, _, metrics = finetuned
    s = metrics.summary
    assert s.gain_interval is not None and s.mean_primary_delta is not None
    low, high = s.gain_interval
    assert low <= s.mean_primary_delta <= high
    gains = [t.gain for t in metrics.tasks.values() if t.gain]
    assert len(gains) == len(metrics.tasks)
    assert min(g[1] for g in gains) <= low and high <= max(g[2] for g in gains)
    shown = f"{points(s.mean_primary_delta, signed=True)} [{points(low, signed=True)}, "
    assert metrics.verdict is not None and metrics.verdict[0].startswith(f"DAPT bought {shown}")


def test_evaluation_md_states_the_perplexity_without_comparing_with_an_untrained_head(finetuned) -> None:
    _, paths, _, _ = finetuned
    pretrain = read_report(paths.pretrain_report, PretrainReport)
    text = paths.evaluation.read_text()
    assert "## Held-out domain perplexity" in text
    if pretrain.base_model in NO_MLM_HEAD:
        assert "ships no MLM head" in text and "->" not in text.split("## Held-out domain perplexity")[1].split("##")[0]
    else:
        assert f"adapted {pretrain.adapted_perplexity:.3g}" in text
