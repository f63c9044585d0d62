"""The two task types added through the registry alone: multi-label classification and regression.

Metrics are checked against scikit-learn and scipy; record normalisation names bad records; and a
tiny project with one task of each type goes through ingest, validate, tokenize, pretrain,
finetune, evaluate and register (a real `mlflow server`), and the registered champion answers
what evaluate scored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.core.errors import DataError
from pipeline.core.paths import Paths
from pipeline.core.sections.finetune import FinetuneTaskConfig
from pipeline.tasks.base import Record
from pipeline.tasks.metrics import paired_bootstrap
from pipeline.tasks.registry import REGISTRY
from pipeline.tasks.spec import TaskSpec
from tests.conftest import ROOT, TINY_FINETUNE, TINY_PRETRAIN, write_params

MULTI = REGISTRY["multilabel_classification"]
REG = REGISTRY["regression"]
LABELS = ["cardiac", "hepatic", "renal"]
ML_SPEC = TaskSpec("topics", MULTI.name, LABELS, FinetuneTaskConfig())
REG_SPEC = TaskSpec("similarity", REG.name, [], FinetuneTaskConfig())


# ----------------------------------------------------------------------------- metrics


def test_multilabel_metrics_match_scikit_learn() -> None:
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    gold = (rng.random((200, 3)) < [0.5, 0.2, 0.0]).astype(int)  # 'renal' never gold ...
    pred = (rng.random((200, 3)) < [0.4, 0.3, 0.0]).astype(int)  # ... nor predicted: not in the macro mean
    m = MULTI.score(gold.tolist(), pred.tolist(), ML_SPEC)
    assert m["micro_f1"] == pytest.approx(f1_score(gold, pred, average="micro"))
    assert m["macro_f1"] == pytest.approx(f1_score(gold[:, :2], pred[:, :2], average="macro"))
    assert m["subset_accuracy"] == pytest.approx((gold == pred).all(1).mean())
    for i, label in enumerate(LABELS[:2]):
        assert m["per_label"][label]["f1"] == pytest.approx(f1_score(gold[:, i], pred[:, i]))
        assert m["per_label"][label]["support"] == gold[:, i].sum()
    summed = MULTI.stats(gold.tolist(), pred.tolist(), ML_SPEC).sum(0)
    assert MULTI.from_stats(summed, ML_SPEC) == {k: m[k] for k in MULTI.metrics}


def test_regression_metrics_match_scipy_and_the_bootstrap_statistics() -> None:
    from scipy.stats import pearsonr, spearmanr

    rng = np.random.default_rng(1)
    gold = rng.normal(size=300).round(1)  # ties, as scores in files have
    pred = gold + rng.normal(scale=0.8, size=300)
    m = REG.score(gold.tolist(), pred.tolist(), REG_SPEC)
    assert m["pearson"] == pytest.approx(pearsonr(gold, pred).statistic)
    assert m["spearman"] == pytest.approx(spearmanr(gold, pred).statistic)
    assert m["mse"] == pytest.approx(np.mean((gold - pred) ** 2))
    summed = REG.stats(gold.tolist(), pred.tolist(), REG_SPEC).sum(0)
    assert REG.from_stats(summed, REG_SPEC) == pytest.approx({k: m[k] for k in ("pearson", "spearman", "mse")})
    # the trivial baseline predicts one number: no correlation, and the MSE of the mean
    trivial = REG.trivial([{"score": s} for s in gold], [{}] * len(gold), REG_SPEC)
    assert REG.score(gold.tolist(), trivial, REG_SPEC)["pearson"] == 0.0
    # a better model's paired interval lies above zero
    worse = gold + rng.normal(scale=2.0, size=300)
    ci = paired_bootstrap(
        REG.stats(gold, pred, REG_SPEC),
        REG.stats(gold, worse, REG_SPEC),
        lambda s: REG.from_stats(s, REG_SPEC)["pearson"],
        500,
        0,
    )
    assert 0 < ci["low"] < ci["delta"] < ci["high"]


# ----------------------------------------------------------------------------- records


def _record(kind, raw: dict, fields: dict | None = None) -> dict:
    column = {**kind.fields, **(fields or {})}.__getitem__
    return kind.normalize(Record(raw, column, Path("tasks/x.jsonl"), 7, "NFKC"))


def test_multilabel_records_take_lists_or_joined_strings() -> None:
    assert _record(MULTI, {"text": "t", "labels": ["renal", "cardiac", "renal"]})["labels"] == ["cardiac", "renal"]
    assert _record(MULTI, {"text": "t", "labels": "renal | hepatic"})["labels"] == ["hepatic", "renal"]
    assert _record(MULTI, {"text": "t", "labels": ""})["labels"] == []
    with pytest.raises(DataError, match=r"tasks/x.jsonl:7.*'labels' must be a list of labels"):
        _record(MULTI, {"text": "t", "labels": {"a": 1}})
    for joined in ("renal|hepatic|", "|renal", "renal||hepatic"):
        with pytest.raises(DataError, match=r"tasks/x.jsonl:7: \[empty-label\] field 'labels' holds an empty label"):
            _record(MULTI, {"text": "t", "labels": joined})


def test_ner_tokens_must_be_strings() -> None:
    ner = REGISTRY["token_classification"]
    assert _record(ner, {"tokens": ["BRCA1", "cancer"], "tags": ["O", "B-Disease"]})["tokens"] == ["BRCA1", "cancer"]
    for bad, shown in ((None, "NoneType None"), (5, "int 5")):
        with pytest.raises(DataError, match=rf"tasks/x.jsonl:7: \[wrong-type\] token 1 of field 'tokens' .*{shown}"):
            _record(ner, {"tokens": ["BRCA1", bad], "tags": ["O", "B-Disease"]})


def test_regression_records_need_a_finite_number() -> None:
    assert _record(REG, {"text": "a", "score": "3.5"}) == {"text": "a", "text_pair": None, "score": 3.5}
    assert _record(REG, {"s1": "a", "s2": "b", "sim": 2}, {"text": "s1", "text_pair": "s2", "score": "sim"}) == {
        "text": "a",
        "text_pair": "b",
        "score": 2.0,
    }
    for bad in ("high", float("nan"), True, None):
        with pytest.raises(DataError, match=r"tasks/x.jsonl:7"):
            _record(REG, {"text": "a", "score": bad})


# ----------------------------------------------------------------------------- end to end

KEYWORDS = {"cardiac": "heart rhythm", "hepatic": "liver enzymes", "renal": "kidney filtration"}
FILLER = [
    "patients",
    "received",
    "the",
    "study",
    "drug",
    "daily",
    "and",
    "were",
    "followed",
    "for",
    "several",
    "weeks",
    "in",
    "the",
    "clinic",
]


def _write_tasks(root: Path) -> list[dict]:
    """A multi-label task (keywords decide the labels) and a pair regression task (word overlap decides the score)."""
    rng = np.random.default_rng(7)
    out = root / "data" / "typed"
    out.mkdir(parents=True)
    for split, n in (("train", 160), ("validation", 40), ("test", 40)):
        topics, pairs = [], []
        for i in range(n):
            chosen = sorted(lbl for lbl in LABELS if rng.random() < 0.4)
            words = list(rng.choice(FILLER, 6)) + [w for lbl in chosen for w in KEYWORDS[lbl].split()]
            rng.shuffle(words)
            topics.append({"text": f"{split} case {i}: " + " ".join(words), "labels": "|".join(chosen)})
            a, keep = list(rng.choice(FILLER, 8)), rng.random()
            b = [w if rng.random() < keep else "placebo" for w in a]
            pairs.append({"s1": f"{split} {i} " + " ".join(a), "s2": " ".join(b), "sim": round(5 * keep, 2)})
        pd.DataFrame(topics).to_csv(out / f"topics_{split}.csv", index=False)
        (out / f"sim_{split}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    files = lambda stem, ext: {s: f"data/typed/{stem}_{s}.{ext}" for s in ("train", "validation", "test")}  # noqa: E731
    return [
        {"name": "topics", "type": MULTI.name, "files": files("topics", "csv"), "labels": LABELS},
        {
            "name": "similarity",
            "type": REG.name,
            "files": files("sim", "jsonl"),
            "fields": {"text": "s1", "text_pair": "s2", "score": "sim"},
        },
    ]


@pytest.mark.slow
def test_multilabel_and_regression_train_evaluate_register_and_serve(
    built_demo, mlflow_server: str, tmp_path: Path
) -> None:
    import mlflow

    from pipeline.modelling.precision import resolve_precision
    from pipeline.training.data import load_contender
    from pipeline.training.multitask import score_task

    _, demo_paths = built_demo
    (tmp_path / "data").mkdir()
    shutil.copytree(demo_paths.demo, tmp_path / "data" / "demo")
    tasks = _write_tasks(tmp_path)
    name = "adaptbert-typed"
    params = write_params(
        tmp_path / "params.yaml",
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        **{
            "ingest.tasks": tasks,
            "finetune.tasks": {"topics": {"class_weights": "balanced"}},
            "register.model_name": name,
            "register.min_gain_over_trivial": -1.0,
        },
    )
    from pipeline.core.config import load_config
    from pipeline.stages import evaluate, finetune, ingest, pretrain, tokenize, validate

    cfg = load_config(params)
    paths = Paths(tmp_path)
    for stage in (ingest, validate, tokenize, pretrain, finetune, evaluate):  # in this process: the data and model path
        stage.run(cfg, paths)
    done = subprocess.run(  # as dvc runs it: the registry is reached through the stage's MLflow run
        [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(tmp_path), "register"],
        cwd=ROOT,
        env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"register: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"

    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())["tasks"]
    assert metrics["topics"]["primary"] == "micro_f1" and set(metrics["topics"]["adapted"]["per_label"]) == set(LABELS)
    assert metrics["similarity"]["primary"] == "pearson" and metrics["similarity"]["trivial"]["pearson"] == 0.0
    for task in metrics.values():
        assert {"adapted", "baseline", "delta", "ci_low", "ci_high"} <= set(task)
    report = (tmp_path / "reports" / "evaluation.md").read_text()
    assert "### topics: F1 by label" in report and (tmp_path / "reports" / "plots" / "label_f1_topics.png").exists()
    assert json.loads((tmp_path / "reports" / "promotion.json").read_text())["champion_after"] == "1"

    model, tok, data = load_contender(paths.finetuned, cfg, paths, paths.task_features)
    scored = {t: score_task(model, data[t], "test", tok.pad_token_id, 16, resolve_precision("auto")) for t in data}
    test = {t: data[t].rows["test"] for t in data}
    request = pd.DataFrame(
        [{"task": "topics", "text": r["text"]} for r in test["topics"]]
        + [{"task": "similarity", "text": r["text"], "text_pair": r["text_pair"]} for r in test["similarity"]]
    )
    mlflow.set_tracking_uri(mlflow_server)
    (tmp_path / "served").mkdir()
    champion = mlflow.pyfunc.load_model(f"models:/{name}@champion", dst_path=str(tmp_path / "served"))
    served = champion.predict(request).to_dict("records")
    topics, similarity = served[: len(test["topics"])], served[len(test["topics"]) :]
    for answer, hot in zip(topics, scored["topics"].pred, strict=True):
        assert sorted(x["label"] for x in answer["labels"]) == [lbl for lbl, h in zip(LABELS, hot, strict=True) if h]
        assert all(0.5 <= x["score"] <= 1 for x in answer["labels"]) and answer["value"] is None
    assert [a["value"] for a in similarity] == pytest.approx(scored["similarity"].pred, abs=1e-4)
    assert all(a["labels"] is None and a["label"] is None for a in similarity)
