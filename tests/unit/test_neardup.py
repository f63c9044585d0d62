"""Near-duplicates and decontamination: MinHash over word n-grams, in ingest and on its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.config import ConfigError
from pipeline.core.io import read_report
from pipeline.core.reports.ingest import IngestReport
from pipeline.reporting.html import data_section
from pipeline.stages import ingest
from pipeline.text import neardup as nd
from tests.conftest import corpus_texts, make_config
from tests.data.test_ingest import _project_with_corpus

FILLER = "The trial enrolled adults at four centres and followed them for a year after the last visit."
TOPICS = ["soil", "rain", "bees", "salt", "iron", "milk", "wind", "corn", "silk", "moss", "coal", "wool"]


def _unrelated(i: int) -> str:
    """Documents that share no run of words with each other or with the demo tasks."""
    a, b = TOPICS[i % len(TOPICS)], TOPICS[(i * 5 + 3) % len(TOPICS)]
    return f"Notes {i}: {a} and {b} were weighed {i} times; {b} {i + 7} grams, {a} {i * 3 + 1} grams on day {i % 9}."


def _shingle_set(text: str, n: int) -> set[int]:
    words = nd.words_of([text])
    flat, _ = nd.shingles(words.hashes, words.text_offsets, n)
    return set(flat.tolist())


def _jaccard(a: str, b: str, n: int) -> float:
    x, y = _shingle_set(a, n), _shingle_set(b, n)
    return len(x & y) / len(x | y)


def _longest_test_sentence(paths, task: str) -> str:
    rows = pq.read_table(paths.tasks / task / "test.parquet").to_pylist()
    texts = [r.get("text") or " ".join(r["tokens"]) for r in rows]
    return max(texts, key=lambda t: len(t.split()))


def _change_one_word(sentence: str, new: str = "zorblax") -> str:
    words = sentence.split()
    words[len(words) // 2] = new
    return " ".join(words)


def test_words_ignore_case_spacing_and_punctuation() -> None:
    a = nd.words_of(["The Primary outcome, at week 24, was met."])
    b = nd.words_of(["the primary   outcome at WEEK 24 was met"])
    assert a.hashes.tolist() == b.hashes.tolist()
    assert len(a.hashes) == 8
    assert len(set(nd.words_of(["met mét meet"]).hashes.tolist())) == 3


def test_sentences_and_texts_are_segmented_like_the_regex_split() -> None:
    texts = ["First one. Second, with e.g. a comma! Third? Yes", "Another text. (p<0.05). End"]
    words = nd.words_of(texts)
    assert words.text_offsets.tolist()[0] == 0 and words.text_offsets[-1] == len(words.hashes)
    sentences = nd._sentence_strings(texts, words)
    assert sentences == [
        "First one.",
        "Second, with e.g.",
        "a comma!",
        "Third?",
        "Yes",
        "Another text.",
        "(p<0.05).",
        "End",
    ]
    assert words.sentence_text.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]


def test_chinese_characters_are_words_and_chinese_full_stops_end_sentences() -> None:
    texts = ["研究显示，新药可以缓解慢性疼痛。患者症状明显改善！还要观察吗？", "Dose 5 µg. Next"]
    words = nd.words_of(texts)
    assert words.text_offsets.tolist() == [0, 27, 31]  # 27 CJK characters; dose, 5, µg, next
    assert nd._sentence_strings(texts, words) == [
        "研究显示，新药可以缓解慢性疼痛。",
        "患者症状明显改善！",
        "还要观察吗？",
        "Dose 5 µg.",
        "Next",
    ]
    # full-width punctuation and spacing never count, as ASCII punctuation does not
    assert nd.words_of(["新药，可以。"]).hashes.tolist() == nd.words_of(["新药 可以."]).hashes.tolist()
    assert nd.spaced("Dose 5 µg. Next") == "Dose 5 µg. Next"  # text without CJK is read as it always was


def test_a_near_copy_of_a_chinese_test_sentence_is_found() -> None:
    """Re-punctuated and re-spaced, its last character changed (character-bigram Jaccard 0.92), inside a longer
    corpus text: found; an unrelated sentence is not."""
    test = "央视新闻：今年春节假期全国旅游收入大幅增长，达到历史新高"
    index = nd.EvaluationIndex([("tnews", "test", test)], 0.7, 2, 20, 0.01)
    assert index.size == 1
    corpus = [
        "据报道。央视新闻 今年春节假期全国旅游收入大幅增长，达到历史新峰！其他内容在此。",
        "完全不同的一句话，和测试集无关的内容在这里出现。",
    ]
    found = index.contaminated(corpus, nd.words_of(corpus))
    assert found[1] is None and found[0] is not None
    assert found[0].task == "tnews" and found[0].containment >= 0.7
    assert found[0].corpus_sentence == "央视新闻 今年春节假期全国旅游收入大幅增长，达到历史新峰！"


def test_shingles_stay_inside_their_segment_and_short_segments_give_one() -> None:
    words = nd.words_of(["a b c d", "e f"])
    flat, offsets = nd.shingles(words.hashes, words.text_offsets, 3)
    assert offsets.tolist() == [0, 2, 3]  # a b c, b c d | e f (shorter than 3: one shingle)
    alone = nd.shingles(nd.words_of(["e f"]).hashes, np.array([0, 2]), 3)[0]
    assert flat[2] == alone[0]


def test_minhash_estimates_jaccard_within_its_error() -> None:
    base = " ".join(f"w{i}" for i in range(200))
    other = " ".join(f"w{i}" for i in range(60, 260))  # 140 of 200 shared words
    truth = _jaccard(base, other, 1)
    words = nd.words_of([base, other])
    sigs = nd.signatures(*nd.shingles(words.hashes, words.text_offsets, 1), 256, 1)
    assert abs(float(nd.estimated_jaccard(sigs[0], sigs[1])) - truth) < 0.1


def test_lsh_bands_put_the_s_curve_near_the_threshold() -> None:
    for threshold in (0.5, 0.8, 0.9):
        bands, rows = nd.lsh_bands(threshold, 128)
        assert bands * rows <= 128
        assert abs((1 / bands) ** (1 / rows) - threshold) < 0.12  # the S-curve's inflection


def test_near_duplicate_index_keeps_the_first_copy() -> None:
    doc = " ".join(f"Patient {i} received the study drug and reported no adverse event." for i in range(12))
    near = doc.replace("Patient 7", "Participant 7")
    unrelated = " ".join(f"Sample {i} of soil was dried at {i * 3} degrees for a week." for i in range(12))
    texts = [doc, unrelated, near, doc.upper()]
    index = nd.NearDuplicateIndex(0.8, 5, 128, 1)
    found = index.check_batch(nd.words_of(texts), ["doc", "unrelated", "near", "upper"])
    assert found[0] is None and found[1] is None
    assert found[2] is not None and found[2][0] == "doc" and found[2][1] >= 0.8
    assert found[3] == ("doc", 1.0)
    assert _jaccard(doc, near, 5) >= 0.8
    # a later batch is compared with the documents kept from earlier ones
    again = index.check_batch(nd.words_of([near]), ["later"])
    assert again[0] is not None and again[0][0] == "doc"


POOL = [int(k) for k in np.random.default_rng(0).integers(0, 2**64, 41, dtype=np.uint64)]  # spread over the top bits


@given(st.lists(st.sampled_from(POOL), max_size=300), st.integers(1, 9))
def test_first_seen_answers_like_a_dict_through_runs_and_merges(keys: list[int], spill: int) -> None:
    """The compact key table against ``dict.setdefault``: the first number stored under a key wins, whether it sits
    in ``recent`` or in a sorted run, with runs sealed and merged every few keys and the filter in front of the runs
    (16 bits to start: it grows, and must never hide a stored key)."""
    table, reference = nd.FirstSeen(spill=spill, filter_bits=4), {}
    for number, key in enumerate(keys):
        stored = int(table.in_runs(np.array([key], dtype=np.uint64))[0])
        if stored < 0:
            stored = table.recent.setdefault(key, number)
        assert stored == reference.setdefault(key, number)
        table.seal()
    assert len(table.runs) <= max(1, 2 * len(keys).bit_length())
    assert table.stored * 8 <= 1 << table.filter_bits  # the filter grew with the runs


def test_the_filter_in_front_of_the_runs_passes_every_stored_key_and_few_others() -> None:
    rng = np.random.default_rng(1)
    stored, other = rng.integers(0, 2**64, 5000, dtype=np.uint64), rng.integers(0, 2**64, 20000, dtype=np.uint64)
    table = nd.FirstSeen(spill=1000)
    for i, key in enumerate(stored.tolist()):
        table.recent.setdefault(key, i)
        table.seal()
    assert table.may_hold(stored[: table.stored]).all()
    assert table.may_hold(other).mean() < 0.15  # >= 8 bits per stored key: ~12% pass on to the binary searches
    assert (table.in_runs(stored[: table.stored]) == np.arange(table.stored)).all()


def test_near_duplicate_decisions_do_not_depend_on_when_keys_move_into_runs() -> None:
    """Batches of near-copies checked with the key table sealing every 3 keys decide exactly as with one dict."""
    rng = np.random.default_rng(3)
    base = [" ".join(f"w{w}" for w in rng.integers(0, 300, 60)) for _ in range(30)]
    texts = [t if i % 3 else t.replace("w1", "w999", 1) for i, t in enumerate(base * 3)]
    results = []
    for spill in (3, 1 << 20):
        index = nd.NearDuplicateIndex(0.8, 5, 128, 1)
        index.buckets.spill = spill
        found = []
        for i in range(0, len(texts), 7):
            found += index.check_batch(
                nd.words_of(texts[i : i + 7]), [str(j) for j in range(i, i + 7)][: len(texts[i : i + 7])]
            )
        results.append(found)
    assert results[0] == results[1]
    assert sum(r is not None for r in results[0]) >= 30  # the copies were found


WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lam", "mu"]


@settings(max_examples=60, deadline=None)
@given(
    evaluation=st.lists(st.lists(st.sampled_from(WORDS), min_size=3, max_size=12), min_size=1, max_size=8),
    corpus=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=30), min_size=1, max_size=6),
    threshold=st.sampled_from([0.5, 0.7, 0.9, 1.0]),
)
def test_containment_finds_exactly_what_brute_force_finds(
    evaluation: list[list[str]], corpus: list[list[str]], threshold: float
) -> None:
    """The anchors only narrow the search: every corpus text holding a sentence with at least ``threshold`` of an
    evaluation sentence's counted shingles is found, with that best containment, and no other text."""
    texts = [" ".join(words) + "." for words in evaluation]
    index = nd.EvaluationIndex([("t", "test", t) for t in texts], threshold, 2, 1, 1.0)
    docs = [" ".join(words) + "." for words in corpus]
    found = index.contaminated(docs, nd.words_of(docs))
    for doc, hit in zip(docs, found, strict=True):
        best = max(len(_shingle_set(t, 2) & _shingle_set(doc, 2)) / len(_shingle_set(t, 2)) for t in texts)
        if best >= threshold - 1e-9:
            assert hit is not None and hit.containment == round(best, 3), (doc, best, hit)
        else:
            assert hit is None, (doc, best, hit)


def test_ingest_drops_planted_near_copies_of_test_sentences_and_counts_them(built_demo, tmp_path: Path) -> None:
    _, demo_paths = built_demo
    role, ner = _longest_test_sentence(demo_paths, "role"), _longest_test_sentence(demo_paths, "ner")
    changed = _change_one_word(role)
    planted = {
        "recased": f"Introduction. {role.upper()} {FILLER}",
        "respaced": f"Methods of the trial. {ner.replace(' ', '   ').replace(',', ' ,')} {FILLER}",
        "changed": f"{FILLER} {changed} Then the report goes on.",
    }
    clean = [_unrelated(i) for i in range(20)]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, [*planted.values(), *clean])
    report = ingest.run(cfg, paths).as_json()
    dc = report["decontamination"]
    # re-cased and re-spaced copies are exact copies to the leakage guard (case and spacing ignored)
    assert report["corpus"]["dropped"]["leakage"] == 2 == dc["exact_copies"]
    assert report["corpus"]["dropped"]["contaminated"] == 1 == dc["near_copies"]
    assert dc["documents_dropped"] == 3
    assert dc["by_task"]["role"] == 2 and dc["by_task"]["ner"] == 1
    assert sum(dc["by_task"].values()) == 3 and list(dc["by_source"].values()) == [3]
    assert dc["evaluation_sentences_indexed"] > 0
    examples = dc["examples"]["role"]
    assert {e["line"] for e in examples} == {1, 3} and all(e["split"] == "test" for e in examples)
    assert all(e["containment"] >= 0.7 for e in examples)
    assert any(e["corpus_sentence"] == changed for e in examples)
    kept = corpus_texts(paths)
    assert sorted(kept) == sorted(clean)
    lines = ingest.summary(IngestReport.model_validate(report), cfg, paths)
    assert (
        "decontamination: 3 document(s) held a copy (2) or near-copy (1)" in lines
        and "role 2" in lines
        and "ner 1" in lines
    )


def test_one_word_edits_of_short_test_sentences_are_all_dropped(built_demo, tmp_path: Path) -> None:
    """Issue 61 (Why 8): 20 role test sentences of 8+ words, each with its middle word replaced (half of them also
    upper-cased and double-spaced), planted as 20 documents of two such copies each: the Jaccard rule dropped 9 of
    the 20 (one changed word in an 8-word sentence leaves Jaccard 0.56); containment drops all of them, and none of
    the clean documents beside them."""
    _, demo_paths = built_demo
    rows = pq.read_table(demo_paths.tasks / "role" / "test.parquet").to_pylist()
    sentences = sorted({r["text"] for r in rows if len(r["text"].split()) >= 8}, key=lambda t: (len(t), t))[:20]
    assert len(sentences) == 20 and len(sentences[0].split()) < 15  # under the ~20 words Jaccard needed
    planted = []
    for i, sentence in enumerate(sentences):
        edited = _change_one_word(sentence, new=f"qux{i}")
        if i % 2:
            edited = "  ".join(edited.upper().split())
        planted.append(f"{edited} {FILLER} {edited}")
    clean = [_unrelated(i) for i in range(20)]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, [*planted, *clean])
    report = ingest.run(cfg, paths).as_json()
    assert report["corpus"]["dropped"].get("contaminated", 0) == 20
    assert sorted(corpus_texts(paths)) == sorted(clean)


def test_decontamination_can_be_switched_off_and_tightened(built_demo, tmp_path: Path) -> None:
    """The same planted one-word edit is dropped at the default threshold (the positive control), kept with the
    check off, and kept at 0.99 (every shingle counted: the edit breaks two of them)."""
    _, demo_paths = built_demo
    role = _longest_test_sentence(demo_paths, "role")
    docs = [f"{FILLER} {_change_one_word(role)}", *(_unrelated(i) for i in range(10))]
    every = {"ingest.decontamination.common_share": 1.0}
    for name, overrides, dropped in [
        ("default", every, 1),
        ("off", {"ingest.decontamination.enabled": False}, 0),
        ("strict", {**every, "ingest.decontamination.threshold": 0.99}, 0),
    ]:
        cfg, paths = _project_with_corpus(built_demo, tmp_path / name, docs, **overrides)
        assert ingest.run(cfg, paths).as_json()["corpus"]["dropped"].get("contaminated", 0) == dropped, name
        assert len(corpus_texts(paths)) == len(docs) - dropped, name


def test_ingest_drops_near_duplicate_documents(built_demo, tmp_path: Path) -> None:
    doc = " ".join(f"Patient {i} received the study drug and reported no adverse event." for i in range(12))
    docs = [doc, doc.replace("Patient 7", "Participant 7"), *(_unrelated(i) for i in range(10))]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, docs)
    report = ingest.run(cfg, paths).as_json()
    assert report["corpus"]["dropped"]["near_duplicate"] == 1 == report["near_duplicates"]["documents_dropped"]
    assert report["near_duplicates"]["examples"][0]["line"] == 2
    assert doc in corpus_texts(paths) and len(corpus_texts(paths)) == 11
    assert "near-duplicates: 1 document(s)" in ingest.summary(IngestReport.model_validate(report), cfg, paths)


def test_batches_give_the_same_result_as_one_pass(built_demo, tmp_path: Path) -> None:
    doc = " ".join(f"Patient {i} received the study drug and reported no adverse event." for i in range(12))
    docs = [*(_unrelated(i) for i in range(7)), doc, *(_unrelated(i) for i in range(7, 14)), doc + " Yes."]
    results = []
    for chunk in (3, 5000):
        cfg, paths = _project_with_corpus(built_demo, tmp_path / str(chunk), docs, **{"ingest.chunk_docs": chunk})
        report = ingest.run(cfg, paths).as_json()
        results.append((report["corpus"]["dropped"], sorted(corpus_texts(paths))))
    assert results[0] == results[1] and results[0][0]["near_duplicate"] == 1


def test_run_report_shows_the_counts_and_escapes_the_examples(built_demo, tmp_path: Path) -> None:
    _, demo_paths = built_demo
    role = _longest_test_sentence(demo_paths, "role")
    docs = [f"{FILLER} {_change_one_word(role, '<blink>')}", *(_unrelated(i) for i in range(10))]
    cfg, paths = _project_with_corpus(built_demo, tmp_path, docs)
    report = ingest.run(cfg, paths)
    html = data_section(read_report(paths.ingest_report, IngestReport), None)
    assert "Decontamination" in html and "<blink>" not in html and "&lt;blink&gt;" in html
    assert report.decontamination.by_task["role"] == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ingest.decontamination.threshold", 0.0),
        ("ingest.decontamination.threshold", 1.5),
        ("ingest.near_duplicates.threshold", -0.1),
        ("ingest.near_duplicates.shingle_words", 0),
        ("ingest.minhash.num_perm", 4),
    ],
)
def test_bad_settings_name_the_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(**{key: value})
