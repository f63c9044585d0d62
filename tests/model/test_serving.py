"""The serving predictor answers what the evaluate stage scored, for every task type, from raw text."""

from __future__ import annotations

import copy
import json
import re

import pandas as pd
import pytest
from seqeval.metrics.sequence_labeling import get_entities

from pipeline.modelling.precision import resolve_precision
from pipeline.serving.service import InputError, Predictor
from pipeline.text.words import split_words
from pipeline.training.data import load_contender
from pipeline.training.multitask import score_task
from tests.conftest import SHARED_DATA, environment_skip


@pytest.fixture(scope="module")
def served(finetuned) -> tuple:
    cfg, paths, _, _ = finetuned
    predictor = Predictor(
        paths.finetuned, cfg.tokenize.max_seq_length, cfg.tokenize.doc_stride, batch_size=16, precision="auto"
    )
    model, tok, tasks = load_contender(paths.finetuned, cfg, paths, paths.task_features)
    return predictor, model, tok, tasks


def _frame(rows: list[dict]) -> pd.DataFrame:
    # object columns, as MLflow's scoring server builds them from JSON (pyarrow strings refuse a lone surrogate)
    return pd.DataFrame(rows, columns=["task", "text", "text_pair", "question", "context"], dtype=object)


def test_classification_answers_match_the_evaluated_predictions(served) -> None:
    predictor, model, tok, tasks = served
    for name, fields in (("role", ("text",)), ("pair", ("text", "text_pair"))):
        rows = tasks[name].rows["test"][:40]
        out = predictor.predict(_frame([{"task": name, **{f: r[f] for f in fields}} for r in rows]))
        scored = score_task(model, tasks[name], "test", tok.pad_token_id, 16, resolve_precision("auto"))
        assert list(out["label"]) == [tasks[name].spec.labels[i] for i in scored.pred[:40]]
        assert all(0.0 < s <= 1.0 for s in out["score"])
        assert out["entities"].isna().all() and out["answer"].isna().all()


def test_qa_answers_match_the_evaluated_spans_and_their_offsets(served) -> None:
    predictor, model, tok, tasks = served
    rows = tasks["qa"].rows["test"][:30]
    out = predictor.predict(_frame([{"task": "qa", "question": r["question"], "context": r["context"]} for r in rows]))
    scored = score_task(model, tasks["qa"], "test", tok.pad_token_id, 16, resolve_precision("auto"))
    assert list(out["answer"]) == scored.pred[:30]
    for r, rec in zip(rows, out.to_dict("records"), strict=True):
        if rec["answer"]:
            assert r["context"][rec["answer_start"] : rec["answer_end"]] == rec["answer"]
            assert 0.0 < rec["score"] <= 1.0


def test_ner_entities_come_with_types_text_and_offsets(served) -> None:
    predictor, model, tok, tasks = served
    rows = tasks["ner"].rows["test"][:100]
    texts = [" ".join(r["tokens"]) for r in rows]
    out = predictor.predict(_frame([{"task": "ner", "text": t} for t in texts]))
    scored = score_task(model, tasks["ner"], "test", tok.pad_token_id, 16, resolve_precision("auto"))
    types = {lbl[2:] for lbl in tasks["ner"].spec.labels if lbl != "O"}
    compared = 0
    for text, row, tags, ents in zip(texts, rows, scored.pred[:100], out["entities"], strict=True):
        for e in ents:
            assert e["type"] in types and text[e["start"] : e["end"]] == e["text"] and 0 < e["score"] <= 1
        words = [w for w, _ in split_words(text)]
        assert words == list(row["tokens"])  # raw text splits into the file's words: the same tags, the same entities
        assert [(e["type"], e["text"]) for e in ents] == [
            (t, " ".join(words[s : e + 1])) for t, s, e in get_entities(tags)
        ]
        compared += len(ents)
    assert compared > 0


@pytest.mark.parametrize(("folder", "joiner"), [("biomed/ncbi_disease", " "), ("zh/cluener", "")])
def test_raw_text_splits_into_the_words_of_real_ner_files(folder: str, joiner: str) -> None:
    path = SHARED_DATA / folder / "test.jsonl"
    if not path.exists():
        environment_skip(f"{path} is absent")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:500]]
    for r in rows:
        text = joiner.join(r["tokens"])
        words = split_words(text)
        assert [w for w, _ in words] == r["tokens"]
        assert all(text[s:e] == w for w, (s, e) in words)


def test_mixed_tasks_keep_the_input_order(served) -> None:
    predictor, *_ = served
    frame = _frame(
        [
            {"task": "qa", "question": "What dose was given?", "context": "Patients received 20 mg of the drug daily."},
            {"task": "role", "text": "Patients were randomised to two arms."},
            {"task": "ner", "text": "Patients received aspirin."},
            {"task": "pair", "text": "A reduced pain.", "text_pair": "Pain fell."},
            {"task": "role", "text": "Mortality at one year was 12% in both arms (p = 0.91)."},
            {"task": "ner", "text": "Vixsi-sulvin was compared with placebo in patients with myxoid carditis."},
        ]
    )
    out = predictor.predict(frame)
    assert list(out["task"]) == ["qa", "role", "ner", "pair", "role", "ner"]
    assert (
        out.loc[1, "label"] is not None
        and out.loc[0, "answer"] is not None
        and isinstance(out.loc[2, "entities"], list)
    )
    # each row's answer is the one it gets alone (a task column copied from the input would pass the check above
    # with the answers of two rows of one task swapped)
    shown = {"qa": "answer", "role": "label", "ner": "entities", "pair": "label"}
    for i, task in enumerate(out["task"]):
        alone = predictor.predict(frame.iloc[[i]].reset_index(drop=True))
        assert _answer(alone.loc[0, shown[task]]) == _answer(out.loc[i, shown[task]]), (i, task)


def _answer(value: object) -> object:
    """A served answer with its scores to 4 decimals: a row batched with longer ones is padded, and padding moves a
    softmax in the 8th decimal on CPU kernels (the spans and labels must not move at all)."""
    if isinstance(value, list):
        return [_answer(v) for v in value]
    if isinstance(value, dict):
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"task": "sentiment", "text": "x"}], r"row 0: unknown task 'sentiment'; this model serves \{"),
        (
            [{"task": "role", "text": "ok"}, {"task": "pair", "text": "a"}],
            r"row 1 \(task 'pair', pair_classification\): 'text_pair' must be",
        ),
        (
            [{"task": "qa", "question": "q?", "context": "  "}],
            r"row 0 \(task 'qa', extractive_qa\): 'context' must be a non-empty string",
        ),
        (
            [{"task": "role", "text": "ok"}, {"task": "role", "text": "dose \ud83d"}],
            r"row 1 \(task 'role', sequence_classification\): 'text' holds a lone surrogate \(U\+D83D\) at character 5",
        ),
        (
            [{"task": "qa", "question": "dose " * 200, "context": "Patients received 20 mg."}],
            r"row 0 \(task 'qa', extractive_qa\): 'question' is 200 tokens; a window of 128 tokens with a stride of "
            r"\d+ leaves room for at most \d+",
        ),
    ],
)
def test_bad_rows_are_named(served, rows: list[dict], message: str) -> None:
    """The bad row (the last) gets its own error naming row, task and field; the good rows before it their answers;
    a request with no good row is refused whole (the scoring server's 400)."""
    predictor, *_ = served
    with pytest.raises(InputError, match=message.replace("row 1", "row 0")):
        predictor.predict(_frame(rows[-1:]))  # alone: it is row 0, and the message says so
    if len(rows) > 1:
        out = predictor.predict(_frame(rows))
        assert re.match(message, out.loc[len(rows) - 1, "error"]), out.loc[len(rows) - 1, "error"]
        assert out.loc[len(rows) - 1, "label"] is None and out.loc[len(rows) - 1, "task"] == rows[-1]["task"]
        assert out.loc[0, "error"] is None and out.loc[0, "label"] is not None
    with pytest.raises(InputError, match="no 'task' column"):
        predictor.predict(pd.DataFrame([{"text": "x"}]))


def test_the_input_example_fits_the_signature_without_pair_or_qa_tasks(tmp_path) -> None:
    """Tasks that use only `text` (the biomed profile: classification + NER) give an example MLflow accepts."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from mlflow.models.utils import _enforce_schema

    from pipeline.serving.service import requests_from_tasks, signature

    for name, kind, row in (
        ("rct", "sequence_classification", {"text": "We enrolled 40 patients.", "label": "METHODS"}),
        ("ncbi", "token_classification", {"tokens": ["BRCA1", "cancer"], "tags": ["O", "B-Disease"]}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.json").write_text(json.dumps({"name": name, "type": kind}))
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / name / "test.parquet")
    example = requests_from_tasks(tmp_path, per_task=1)
    assert list(example.columns) == ["task", "text"] and list(example["text"]) == [
        "BRCA1 cancer",
        "We enrolled 40 patients.",
    ]
    assert list(_enforce_schema(example, signature().inputs)["task"]) == ["ncbi", "rct"]


def test_an_unexpected_error_reaches_the_client_without_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """What MLflow's scoring server sends a client is the MlflowException's JSON: no stack trace, no install paths;
    the trace goes to the server's log."""
    from mlflow.exceptions import MlflowException

    from pipeline.serving.pyfunc_model import MultiTaskPyfunc

    class Broken:
        def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
            raise RuntimeError("boom inside the model")

    pyfunc = MultiTaskPyfunc()
    pyfunc.predictor = Broken()
    with pytest.raises(MlflowException) as info:
        pyfunc.predict(None, pd.DataFrame([{"task": "role", "text": "x"}]))
    body = info.value.serialize_as_json()
    assert "internal error (RuntimeError)" in body and info.value.get_http_status_code() == 500
    assert "stack_trace" not in body and "Traceback" not in body and "site-packages" not in body
    assert "boom inside the model" in caplog.text  # the server's log keeps it


def test_a_request_over_the_size_limit_is_refused_before_any_work(served) -> None:
    """Issue 61 (Why 7): one QA row with a 2 MB context took 27.5 s of both cores (a window every doc_stride
    tokens, no cap); a request holding more text than ``register.serve.max_request_chars`` is an InputError (the
    pyfunc's 400) naming the limit, and one within it is answered."""
    import time

    from pipeline.serving.service import InputError

    predictor, *_ = served
    limited = copy.copy(predictor)
    limited.max_request_chars = 2_000
    huge = {"task": "qa", "question": "What dose was given?", "context": "Patients received 20 mg daily. " * 70_000}
    start = time.perf_counter()
    with pytest.raises(
        InputError,
        match=r"holds 2,170,022 characters of text in 1 row\(s\); .* up to 2,000 per "
        r"request \(register.serve.max_request_chars\)",
    ):
        limited.predict(_frame([huge]))
    assert time.perf_counter() - start < 1.0  # refused before tokenising
    small = {"task": "qa", "question": "What dose was given?", "context": "Patients received 20 mg daily."}
    assert limited.predict(_frame([small])).loc[0, "answer"] is not None
