"""Real public data from ../shared/data, read in place through params (skips when absent)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.paths import Paths
from pipeline.core.stages import NAMES as PIPELINE_STAGES
from pipeline.modelling.shards import open_group
from pipeline.stages import ingest, validate
from tests.conftest import SHARED_DATA, make_config, needs_environment

BIO = SHARED_DATA / "biomed"


@needs_environment(BIO.exists(), "../shared/data/biomed not present")
def test_biomedical_corpus_and_tasks_ingest_and_validate(tmp_path: Path) -> None:
    def splits(task: str) -> dict[str, str]:
        return {
            "train": str(BIO / task / "train.jsonl"),
            "validation": str(BIO / task / "dev.jsonl"),
            "test": str(BIO / task / "test.jsonl"),
        }

    cfg = make_config(
        **{
            "ingest.corpus.sources": [{"type": "files", "path": str(BIO / "corpus" / "*.jsonl")}],
            "ingest.tasks": [
                {"name": "rct", "type": "sequence_classification", "files": splits("rct")},
                {"name": "ncbi_disease", "type": "token_classification", "files": splits("ncbi_disease")},
            ],
            "finetune.tasks": {},  # the demo tasks' settings in params.yaml name tasks this profile does not declare
        }
    )
    paths = Paths(tmp_path)
    report = ingest.run(cfg, paths).as_json()
    assert report["corpus"]["documents_read"] == 3807 + 64  # the two corpus files, per their README
    assert report["corpus"]["documents_kept"] > 3500
    assert report["tasks"]["rct"]["splits"]["train"]["examples"] == 20000
    assert report["tasks"]["ncbi_disease"]["splits"]["test"]["examples"] == 940
    # the shared corpus was built checked against the evaluation text: decontamination finds next to nothing
    dc = report["decontamination"]
    assert set(dc["by_task"]) == {"rct", "ncbi_disease"} and dc["evaluation_sentences_indexed"] > 5000
    assert dc["documents_dropped"] < 10 and report["corpus"]["dropped"].get("contaminated", 0) == dc["near_copies"]
    result = validate.run(cfg, paths)
    assert result["failed_expectations"] == 0


ZH = SHARED_DATA / "zh"


@needs_environment(ZH.exists(), "../shared/data/zh not present")
def test_chinese_corpus_whole_word_with_jieba(tmp_path: Path) -> None:
    """Chinese text: a scratch WordPiece vocab (the offline base vocab lacks most CJK characters)
    and jieba word ids, so that whole-word masking masks words, not characters or clauses."""
    import jieba
    import numpy as np
    from transformers import AutoTokenizer

    from pipeline.stages import tokenize

    cfg = make_config(
        **{
            "ingest.corpus.sources": [{"type": "files", "path": str(ZH / "corpus" / "train.jsonl")}],
            "ingest.tasks": [],
            "finetune.tasks": {},
            "ingest.corpus.min_chars": 5,
            "ingest.corpus.min_words": 1,  # no spaces between Chinese words
            "tokenize.mode": "wordpiece_scratch",
            "tokenize.extend_vocab.enabled": False,
            "tokenize.whole_word": True,
            "tokenize.language": "zh",
            "tokenize.domain_terms": None,
        }
    )
    paths = Paths(tmp_path)
    ingest.run(cfg, paths)
    report = tokenize.run(cfg, paths, require_validation=False)  # a tokenizer test: the corpus was only ingested
    assert report.corpus["train"].documents > 15000
    assert report.unk_share < 0.001
    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    ds, _ = open_group(paths.pretrain_blocks, "train")
    # rebuild the first block's text and check its word ids against jieba on the same text
    ids, words = ds[0]["input_ids"], ds[0]["word_ids"]
    body, body_words = ids[1:-1], np.array(words[1:-1])
    first_doc = body[: body.index(tok.sep_token_id)] if tok.sep_token_id in body else body
    text = "".join(tok.convert_ids_to_tokens(first_doc)).replace("##", "")
    jieba_words = [w for w, _, _ in jieba.tokenize(text)]
    doc_words = body_words[: len(first_doc)]
    assert len(set(doc_words.tolist())) == len(jieba_words)  # one id per jieba word
    multi = [w for w in jieba_words if len(w) > 1]
    assert multi, "the first document has multi-character words"
    pos = 0
    for w in jieba_words:  # characters of one word share its id
        assert len(set(doc_words[pos : pos + len(w)].tolist())) == 1
        pos += len(w)


@needs_environment(ZH.exists(), "../shared/data/zh not present")
def test_the_zh_profile_drops_the_corpus_lines_that_copy_its_test_texts(tmp_path: Path) -> None:
    """The zh corpus shares sources with TNEWS and CLUENER: read character by character, its copies and
    near-copies of their validation/test texts are found (a verbatim TNEWS test headline among them)."""
    from pipeline.core.profiles import profile_overrides
    from tests.conftest import ROOT

    profile = profile_overrides(ROOT, "zh")
    for task in profile["ingest.tasks"]:  # the profile's paths are relative to the project root
        task["files"] = {s: str(ROOT / f) for s, f in task["files"].items()}
    cfg = make_config(
        **{
            **{k: v for k, v in profile.items() if k.startswith("ingest.")},
            "ingest.corpus.sources": [{"type": "files", "path": str(ZH / "corpus" / "train.jsonl")}],
            "finetune.tasks": profile["finetune.tasks"],
        }
    )
    report = ingest.run(cfg, Paths(tmp_path)).as_json()
    dc = report["decontamination"]
    assert dc["evaluation_sentences_indexed"] > 3000  # most TNEWS headlines and CLUENER sentences are searched
    assert dc["exact_copies"] > 0 and dc["near_copies"] > 0 and set(dc["by_task"]) == {"tnews", "cluener"}
    assert all(n > 0 for n in dc["by_task"].values())
    shown = [e["corpus_sentence"] for examples in dc["examples"].values() for e in examples]
    assert any(all("\u4e00" <= ch <= "\u9fff" or not ch.isalnum() for ch in text) for text in shown)


def _head(src: Path, dst: Path, lines: int) -> str:
    """The first ``lines`` records of a shared JSONL file, as a slice in the test's own directory."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, encoding="utf-8") as f:
        dst.write_text("".join(line for _, line in zip(range(lines), f, strict=False)), encoding="utf-8")
    return str(dst)


@pytest.mark.slow
@needs_environment(BIO.exists(), "../shared/data/biomed not present")
def test_biomed_profile_on_a_slice_end_to_end_with_dvc(tmp_path: Path) -> None:
    """profiles/biomed.yaml as a user runs it (`python -m flows.profile biomed --run`, i.e. `dvc exp run`)
    in a fresh repository whose ../shared/data/biomed holds slices of the real files: every stage
    runs, `dvc metrics show` and MLflow hold the task metrics, and both tasks beat their trivial baselines."""
    import os
    import subprocess
    import sys

    from mlflow import MlflowClient

    from tests.conftest import make_repo

    sizes = {"train": 2000, "dev": 150, "test": 300}
    for task in ("rct", "ncbi_disease"):
        for part, n in sizes.items():
            _head(BIO / task / f"{part}.jsonl", tmp_path / "shared" / "data" / "biomed" / task / f"{part}.jsonl", n)
    _head(BIO / "corpus" / "train.jsonl", tmp_path / "shared" / "data" / "biomed" / "corpus" / "train.jsonl", 300)
    _head(
        BIO / "corpus" / "validation.jsonl", tmp_path / "shared" / "data" / "biomed" / "corpus" / "validation.jsonl", 20
    )
    repo = tmp_path / "project"  # the profile's ../shared/data/biomed paths now point at the slices
    repo.mkdir()
    make_repo(repo)
    # CI-sized budget on top of the profile (later -S win): a few DAPT steps, 150 multi-task steps (the profile's
    # budget in epochs, scaled: 0.6 passes over each task's 2,000 sentences, half the steps each, as temperature
    # sampling shared them before) at 3x the profile's learning rate (on the 2-core EPYC: test RCT accuracy 0.77,
    # NCBI F1 0.44; 300 steps at the profile's rate took
    # 100 s more for 0.79 / 0.48), no baseline, no compressed variants (the profile's distillation and recovery
    # budgets are minutes; INT8 of the real model alone cost a minute here; the compress stage still runs and says
    # it is disabled)
    small = {
        "pretrain.max_steps": 4,
        "pretrain.micro_batch_size": 8,
        "pretrain.warmup_steps": 1,
        "pretrain.logging_steps": 2,
        "pretrain.eval_steps": 4,
        "pretrain.save_steps": 4,
        "pretrain.eval_max_blocks": 16,
        "finetune.epochs": 0.6,
        "finetune.tasks": {"rct": {"metric": "micro_f1"}, "ncbi_disease": {"metric": "f1", "epochs": 0.6}},
        "finetune.eval_steps": 75,
        "finetune.learning_rate": 3e-4,
        "finetune.baseline": False,
        "evaluate.bootstrap_resamples": 100,
        "compress.enabled": False,
    }
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    from flows.profile import set_param_args

    cmd = [sys.executable, "-m", "flows.profile", "biomed", "--run", "--", *set_param_args(small)]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = [line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == list(PIPELINE_STAGES)

    shown = json.loads(
        subprocess.run(
            ["dvc", "metrics", "show", "--json"], cwd=repo, env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    headline = next(iter(shown.values()))["data"]["reports/summary.json"]["data"]  # the one DVC metrics file
    assert set(headline) >= {"adapted", "rct", "ncbi_disease", "served", "promoted"}
    metrics = json.loads((repo / "reports" / "metrics.json").read_text())
    assert headline["rct"] == round(metrics["tasks"]["rct"]["adapted"]["micro_f1"], 4)
    tasks = metrics["tasks"]
    rct, ncbi = tasks["rct"], tasks["ncbi_disease"]
    assert rct["primary"] == "micro_f1" and rct["test_examples"] == 300 and ncbi["test_examples"] == 300
    # majority class ~ 1/3 accuracy and ~0.1 macro-F1; all-O finds no entity (F1 0)
    assert rct["adapted"]["accuracy"] >= rct["trivial"]["accuracy"] + 0.2
    assert rct["adapted"]["macro_f1"] >= rct["trivial"]["macro_f1"] + 0.3
    assert ncbi["trivial"]["f1"] == 0.0 and ncbi["adapted"]["f1"] >= 0.3

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    assert client.get_experiment_by_name("adaptbert") is None  # a profile's runs have their own experiment
    runs = client.search_runs(
        [client.get_experiment_by_name("adaptbert-biomed").experiment_id], "attributes.run_name = 'evaluate'"
    )
    assert runs and runs[0].data.tags["adaptbert.profile"] == "biomed"
    assert len(runs) == 1 and runs[0].data.metrics["summary.mean_primary_adapted"] == pytest.approx(
        metrics["summary"]["mean_primary_adapted"]
    )
    parent = client.get_run(runs[0].data.tags["mlflow.parentRunId"])
    assert parent.data.params["ingest.tasks"].count("ncbi_disease") >= 1  # the run's params are the profile's
