"""Long-document classification (``finetune.tasks.<name>.long_text: windows``): encoding, collation, aggregation,
and a task whose label lies past the first max_seq_length tokens, which only the windowed model can learn."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pipeline.core.sections.finetune import FinetuneTaskConfig
from pipeline.modelling.models import load_tokenizer
from pipeline.tasks.base import classifier_windows, collate_windows
from pipeline.tasks.registry import kind_of
from pipeline.tasks.spec import TaskSpec
from pipeline.training.multitask import aggregate_windows
from tests.conftest import TINY_FINETUNE, make_config

FILLER = (
    "the patients were given a dose of the study drug twice daily and observed in the clinic for several weeks "
    "while the nurses recorded blood pressure heart rate and any reported side effects"
)
MAX_LEN, STRIDE = 48, 8


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm", "tokenize.base_tokenizer")


def documents(n: int, seed: int) -> list[dict]:
    """~130-word reports whose label is their last word: past the first 48 tokens, beyond a truncated model."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = ["approved", "rejected"][i % 2]
        body = " ".join(rng.choice(FILLER.split(), 120))
        rows.append(
            {
                "id": f"{seed}-{i}",
                "text": f"{body} the committee decision was {label}",
                "label": label,
                "source_file": "docs.jsonl",
                "source_line": i + 1,
            }
        )
    return rows


def test_windows_cover_the_whole_text_with_the_stride_overlap(tok) -> None:
    rows = documents(4, 0)
    cols = classifier_windows(tok, rows, MAX_LEN, STRIDE, None, max_windows=20)
    for row, windows, count in zip(rows, cols["input_ids"], cols["window_count"], strict=True):
        assert count == len(windows) > 2 and all(len(w) <= MAX_LEN for w in windows)
        body = [w[1:-1] for w in windows]  # without [CLS] ... [SEP]
        for a, b in itertools.pairwise(body):
            assert a[-STRIDE:] == b[:STRIDE]  # neighbours share doc_stride tokens
        joined = body[0] + [t for w in body[1:] for t in w[STRIDE:]]
        assert joined == tok(row["text"], add_special_tokens=False)["input_ids"]  # nothing lost, nothing doubled
    capped = classifier_windows(tok, rows, MAX_LEN, STRIDE, None, max_windows=2)
    assert all(len(w) == 2 for w in capped["input_ids"]) and capped["window_count"] == cols["window_count"]


def test_pair_windows_keep_the_second_text_whole_in_every_window(tok) -> None:
    rows = [{**r, "text_pair": "was the drug approved"} for r in documents(3, 1)]
    cols = classifier_windows(tok, rows, MAX_LEN, STRIDE, "text_pair", max_windows=20)
    pair = tok("was the drug approved", add_special_tokens=False)["input_ids"]
    for windows, types in zip(cols["input_ids"], cols["token_type_ids"], strict=True):
        assert len(windows) > 2
        for ids, tt in zip(windows, types, strict=True):
            second = [t for t, k in zip(ids, tt, strict=True) if k == 1]
            assert second[:-1] == pair  # the hypothesis, then [SEP]


def test_a_pair_whose_second_text_leaves_no_room_is_named(tok) -> None:
    from pipeline.core.errors import DataError

    rows = documents(3, 2)
    rows[1]["text_pair"] = " ".join(["drug"] * 80)
    for r in (rows[0], rows[2]):
        r["text_pair"] = "short"
    with pytest.raises(DataError, match=r"docs\.jsonl:2.*pair-too-long.*'text_pair' is too long"):
        classifier_windows(tok, rows, MAX_LEN, STRIDE, "text_pair", max_windows=4)


def test_collation_and_mean_or_max_aggregation() -> None:
    features = [
        {"input_ids": [[1, 5, 2], [1, 6, 7, 2]], "labels": 1},
        {"input_ids": [[1, 9, 2]], "labels": 0},
    ]
    batch = collate_windows(features, pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 5, 2, 0], [1, 6, 7, 2], [1, 9, 2, 0]]
    assert batch["attention_mask"].sum(1).tolist() == [3, 4, 3]
    assert batch["window_example"].tolist() == [0, 0, 1] and batch["labels"].tolist() == [1, 0]
    logits = torch.tensor([[1.0, -2.0], [3.0, 0.0], [5.0, 4.0]], requires_grad=True)
    mean = aggregate_windows(logits, batch["window_example"], "mean")
    top = aggregate_windows(logits, batch["window_example"], "max")
    assert mean.tolist() == [[2.0, -1.0], [5.0, 4.0]] and top.tolist() == [[3.0, 0.0], [5.0, 4.0]]
    top.sum().backward()  # gradients reach the windows that won the max
    assert logits.grad.tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def _task_data(tok, settings: FinetuneTaskConfig, tc) -> dict:
    from datasets import Dataset

    from pipeline.training.multitask import TaskData

    kind = kind_of("sequence_classification")
    labels = ["approved", "rejected"]
    rows = {"train": documents(160, 10), "validation": documents(40, 11), "test": documents(80, 12)}
    splits = {}
    for split, split_rows in rows.items():
        if settings.long_text == "windows":
            cols = kind.encode_long(tok, split_rows, labels, tc, "verdict", settings.max_windows)
        else:
            cols = kind.encode(tok, split_rows, labels, tc, "verdict")
        splits[split] = Dataset.from_dict(cols)
    spec = TaskSpec("verdict", "sequence_classification", labels, settings)
    return {"verdict": TaskData(spec, splits, rows)}


@pytest.mark.parametrize("long_text", ["truncate", "windows"])
def test_only_the_windowed_model_reads_a_label_past_the_first_window(tok, tmp_path, long_text: str) -> None:
    from transformers import BertConfig, BertModel

    from pipeline.modelling.precision import resolve_precision
    from pipeline.training.multitask import MultiTaskModel, score_task
    from pipeline.training.trainer import TrainJob, train

    cfg = make_config(
        **{
            **TINY_FINETUNE,
            "tokenize.max_seq_length": MAX_LEN,
            "tokenize.doc_stride": STRIDE,
            "finetune.max_steps": 80,
            "finetune.eval_steps": 40,
            "finetune.warmup_ratio": 0.0,
            "finetune.layer_lr_decay": 1.0,
        }
    )
    settings = FinetuneTaskConfig(long_text=long_text, window_aggregation="max", pooling="mean")
    tasks = _task_data(tok, settings, cfg.tokenize)
    if long_text == "windows":
        assert all(len(w) >= 3 for w in tasks["verdict"].splits["test"]["input_ids"])
    torch.manual_seed(0)
    encoder = BertModel(
        BertConfig(
            vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
        ),
        add_pooling_layer=False,
    )
    model = MultiTaskModel(encoder, [tasks["verdict"].spec], dropout=0.0)
    job = TrainJob(
        name="long",
        run_name="long",
        model=model,
        tokenizer=tok,
        tasks=tasks,
        checkpoints=tmp_path / "ckpt",
        curves=tmp_path / "curves",
        max_steps=80,
        learning_rate=3e-3,
    )
    precision = resolve_precision("fp32")
    trained, _ = train(cfg.finetune, 13, job, precision, f"long-{long_text}", "test")
    accuracy = score_task(trained, tasks["verdict"], "test", tok.pad_token_id, 32, precision).metrics["accuracy"]
    if long_text == "windows":
        assert accuracy > 0.95, accuracy
        served = serve_saved(trained, tok, tmp_path / "model", documents(20, 13))
        assert served == [r["label"] for r in documents(20, 13)]  # serving windows and aggregates the same way
    else:
        assert accuracy < 0.7, accuracy  # the first 48 tokens are filler: about chance


def serve_saved(model, tok, out, rows: list[dict]) -> list[str]:
    """Save ``model`` as the finetune stage does and answer ``rows`` as raw-text requests through the Predictor."""
    import pandas as pd

    from pipeline.serving.service import Predictor
    from pipeline.training.multitask import save_multitask

    save_multitask(model, tok, out, "# test model")
    predictor = Predictor(out, MAX_LEN, STRIDE, precision="fp32")
    frame = pd.DataFrame([{"task": "verdict", "text": r["text"]} for r in rows])
    return predictor.predict(frame)["label"].tolist()


def test_the_tokenize_stage_windows_a_task_and_says_so(project) -> None:
    """`finetune.tasks.role.long_text: windows` through the tokenize stage: a row of windows per example, and the
    report and console name the task (a run without windows writes no such key)."""
    import pyarrow as pa

    from pipeline.stages import tokenize

    cfg, paths = project
    windowed = cfg.model_copy(
        update={
            "finetune": cfg.finetune.model_copy(
                update={"tasks": {**cfg.finetune.tasks, "role": FinetuneTaskConfig(long_text="windows")}}
            )
        }
    )
    report = tokenize.run(windowed, paths)
    assert report.long_text == {"role": "windows"}
    role = report.tasks["role"]["test"]
    with pa.ipc.open_stream(str(paths.task_features / "role" / "test.arrow")) as reader:
        table = reader.read_all()
    assert table.num_rows == role.examples and "window_count" in table.column_names
    assert role.features == sum(len(w) for w in table.column("input_ids").to_pylist()) >= role.examples
    assert "role: long texts as windows" in tokenize.summary(report, windowed, paths)
    plain = tokenize.run(cfg, paths)
    assert plain.long_text is None and "long texts" not in tokenize.summary(plain, cfg, paths)
