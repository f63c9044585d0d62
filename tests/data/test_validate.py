"""validate: Great Expectations suites pass on good data and fail, readably, on bad data."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import ValidationFailed
from pipeline.stages import validate
from pipeline.tasks.extractive_qa import answers_at_offsets
from pipeline.tasks.token_classification import bio_is_valid
from tests.conftest import environment_skip


def test_bio_rule() -> None:
    assert bio_is_valid(["O", "B-DRUG", "I-DRUG", "O", "B-DOSE"])
    assert bio_is_valid([])
    assert not bio_is_valid(["O", "I-DRUG"])
    assert not bio_is_valid(["I-DRUG"])
    assert not bio_is_valid(["B-DRUG", "I-DOSE"])
    assert not bio_is_valid(["B-DRUG", "DRUG"])


def test_answer_rule() -> None:
    assert answers_at_offsets("take 5 mg daily", ["5 mg"], [5])
    assert answers_at_offsets("no answer here", [], [])  # unanswerable (SQuAD v2)
    assert not answers_at_offsets("take 5 mg daily", ["5 mg"], [4])
    assert not answers_at_offsets("take 5 mg daily", ["5 mg"], [])


def test_demo_data_passes(project) -> None:
    cfg, paths = project
    result = validate.run(cfg, paths)
    assert result["failed_expectations"] == 0
    report = json.loads(paths.validation_report.read_text())
    assert report["success"] is True
    assert {"corpus.summary", "corpus.documents", "task.ner.train", "task.qa.test", "task.role.labels"} <= {
        s["suite"] for s in report["suites"]
    }
    assert (paths.data_docs / "index.html").exists()


def _edit(paths, task: str, split: str, fn) -> None:
    path = paths.tasks / task / f"{split}.parquet"
    df = pq.read_table(path).to_pandas()
    df = fn(df)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)


def _failures(cfg, paths) -> tuple[str, dict]:
    with pytest.raises(ValidationFailed) as info:
        validate.run(cfg, paths)
    report = json.loads(paths.validation_report.read_text())
    failed = {
        (s["suite"], e["rule"].split(" ")[0] + ":" + str(e["column"])): e
        for s in report["suites"]
        for e in s["expectations"]
        if not e["success"]
    }
    return str(info.value), failed


def test_bad_bio_label_offset_and_empty_text_fail_with_records(project) -> None:
    cfg, paths = project

    def break_bio(df: pd.DataFrame) -> pd.DataFrame:
        df.at[0, "tags"] = ["O"] + list(df.at[0, "tags"][1:-1]) + ["I-DRUG"]  # I- after O at the end
        return df

    def break_label(df: pd.DataFrame) -> pd.DataFrame:
        df.at[1, "label"] = "DISCUSSION"
        df.at[2, "text"] = ""
        return df

    def break_offset(df: pd.DataFrame) -> pd.DataFrame:
        df.at[0, "answer_starts"] = [int(df.at[0, "answer_starts"][0]) + 3]
        return df

    def break_lengths(df: pd.DataFrame) -> pd.DataFrame:
        df.at[3, "tags"] = list(df.at[3, "tags"])[:-1]
        return df

    _edit(paths, "ner", "train", break_bio)
    _edit(paths, "role", "test", break_label)
    _edit(paths, "qa", "validation", break_offset)
    _edit(paths, "ner", "test", break_lengths)
    summary, failed = _failures(cfg, paths)
    keys = set(failed)
    assert ("task.ner.train", "valid:bio_valid") in keys
    assert ("task.role.test", "labels:label") in keys
    assert ("task.role.test", "no:text") in keys
    assert ("task.qa.validation", "every:answer_at_offset") in keys
    assert ("task.ner.test", "token:None") in keys
    assert ("task.ner.train", "tags:unknown_tags") in keys  # I-DRUG never occurs in train
    assert len(keys) == 6
    # the summary names the source file and line of an offending record
    role_bad = failed[("task.role.test", "labels:label")]["offending"][0]
    assert role_bad["file"].endswith("role/test.csv") and role_bad["line"] == 3
    assert f"{role_bad['file']}:3" in summary
    assert "DISCUSSION" in summary


def test_train_test_overlap_and_label_minimum(project) -> None:
    cfg, paths = project
    train = pq.read_table(paths.tasks / "role" / "train.parquet").to_pandas()
    _edit(paths, "role", "test", lambda df: pd.concat([df.iloc[:-20], train.iloc[:20]], ignore_index=True))
    meta_path = paths.tasks / "pair" / "task.json"
    meta = json.loads(meta_path.read_text())
    meta["labels"].append("unsure")
    meta_path.write_text(json.dumps(meta))
    _, failed = _failures(cfg, paths)
    overlap = failed[("task.role.test", "at:in_train")]
    assert overlap["observed"]["unexpected_count"] == 20
    counts = failed[("task.pair.labels", "at:count")]
    assert counts["offending"][0]["values"] == {"label": "unsure", "count": 0}


def test_corpus_thresholds_fail(project) -> None:
    cfg, paths = project
    strict = cfg.validation.corpus.model_copy(update={"min_docs": 10**6, "median_chars_max": 10})
    cfg2 = cfg.model_copy(update={"validation": cfg.validation.model_copy(update={"corpus": strict})})
    summary, failed = _failures(cfg2, paths)
    assert ("corpus.summary", "at:documents_kept") in failed
    assert ("corpus.documents", "median:chars") in failed
    assert "observed" in summary and "expected" in summary


# markup that marks the page's <html> element if a browser ever runs it
HOSTILE = (
    "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','img')\">",
    "<script>document.documentElement.setAttribute('data-pwned','script')</script>",
)


def test_labels_and_values_from_the_data_are_text_in_every_data_docs_page(project) -> None:
    """A label set and offending values holding markup: no page of the Data Docs runs it (headless Chromium), and
    the report keeps the values as they are in the data."""
    import re
    import subprocess

    from tests.e2e.test_report import chromium

    cfg, paths = project
    meta_path = paths.tasks / "role" / "task.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "labels": [*meta["labels"], HOSTILE[1]]}))  # in the rule's label set

    def hostile_value(df: pd.DataFrame) -> pd.DataFrame:
        df.at[1, "label"] = HOSTILE[0]  # outside the label set: GX's table of unexpected values shows it
        return df

    _edit(paths, "role", "test", hostile_value)
    summary, failed = _failures(cfg, paths)
    assert failed[("task.role.test", "labels:label")]["offending"][0]["values"]["label"] == HOSTILE[0]
    assert "<img src=x onerror=" in summary  # the console shows the data as it is
    pages = [p for p in paths.data_docs.rglob("*.html") if "data-pwned" in p.read_text(encoding="utf-8")]
    assert {p.parts[len(paths.data_docs.parts)] for p in pages} == {"expectations", "validations"}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "<img src=x" not in text and "<script>document" not in text, page
    if chromium() is None:
        environment_skip(
            "no headless Chromium here (.ci/run installs the Debian package): the pages were checked as text"
        )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom"]
    for page in pages:
        dom = subprocess.run([chromium(), *flags, page.as_uri()], capture_output=True, text=True, timeout=120).stdout
        assert "labels within the label set" in dom, page  # the page rendered
        assert not re.search(r"<html[^>]*data-pwned", dom), page


def test_every_data_docs_page_opens_offline(built_demo) -> None:
    """Was: GX loads bootstrap, jQuery and more from CDNs and fills its index from JavaScript: offline, every page was
    unstyled and the index empty. Now nothing is requested from the network (no remote stylesheet, script, image or
    frame), the local copies exist, and the index lists every page; headless Chromium, its proxy a closed port,
    renders the index and a validation page."""
    import re
    import subprocess

    from tests.e2e.test_report import chromium

    docs = built_demo[1].data_docs
    pages = sorted(docs.rglob("*.html"))
    remote = re.compile(r"""<(img|link|script|iframe)\b[^>]*?\b(src|href)=["'](?:https?:)?//""", re.I | re.S)
    assert len(pages) > 5 and [p for p in pages if remote.search(p.read_text(encoding="utf-8"))] == []
    for page in pages:
        for ref in re.findall(r'(?:src|href)="([^"]*static/vendor/[^"]+)"', page.read_text(encoding="utf-8")):
            assert (page.parent / ref).resolve().is_file(), (page, ref)
    index = (docs / "index.html").read_text(encoding="utf-8")
    for page in pages:  # was: "Run Name: __none__" and "Data asset: None" on every validation page
        text = page.read_text(encoding="utf-8")
        assert "__none__" not in text and "Data asset: None" not in text, page
    listed = set(re.findall(r'href="((?:validations|expectations)/[^"]+)"', index))
    assert listed == {p.relative_to(docs).as_posix() for p in pages if p != docs / "index.html"}
    if chromium() is None:
        environment_skip(
            "no headless Chromium here (.ci/run installs the Debian package): the pages were checked as text"
        )
    offline = ["--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9", "--dump-dom"]
    dom = subprocess.run(
        [chromium(), *offline, (docs / "index.html").as_uri()], capture_output=True, text=True, timeout=120
    )
    assert "task.role.test" in dom.stdout and "corpus.documents" in dom.stdout
    page = next(p for p in pages if p.parts[len(docs.parts)] == "validations")
    dom = subprocess.run([chromium(), *offline, page.as_uri()], capture_output=True, text=True, timeout=120)
    assert "Expectation Validation Result" in dom.stdout and "static/vendor/bootstrap.min.css" in dom.stdout
