"""tokenize: vocab extension, scratch vocab, whole-word ids, packing, task encodings, bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasets import Dataset

from pipeline.core.config import ConfigError
from pipeline.core.errors import DataError
from pipeline.core.io import file_digest
from pipeline.core.paths import Paths
from pipeline.modelling.blocks import WordSegmenter
from pipeline.modelling.labels import IGNORE_INDEX as IGNORE
from pipeline.modelling.models import load_tokenizer
from pipeline.modelling.shards import open_group
from pipeline.stages import tokenize, validate
from pipeline.tasks.encoding import encode_task_split
from pipeline.tasks.token_classification import align_token_labels
from pipeline.text.vocab import raw_backend
from tests.conftest import corpus_texts, make_config


@pytest.fixture(scope="module")
def base():
    return load_tokenizer("minilm", "tokenize.base_tokenizer")


@pytest.fixture
def tokenized(project):
    """The small demo project, validated and tokenized with the repository defaults."""
    cfg, paths = project
    validate.run(cfg, paths)
    return cfg, paths, tokenize.run(cfg, paths)


def _blocks(paths: Paths, group: str) -> Dataset:
    return open_group(paths.pretrain_blocks, group)[0]  # memory-mapped Arrow shards


def test_vocab_extension_round_trip(tokenized, base) -> None:
    cfg, paths, report = tokenized
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    new = json.loads((paths.tokenizer / "new_tokens.json").read_text())
    assert 0 < len(new) <= cfg.tokenize.extend_vocab.max_new_tokens == 200
    assert report.new_tokens == len(new) and len(tok) == len(base) + len(new)
    for word, info in new.items():
        assert tok(word, add_special_tokens=False)["input_ids"] == [info["id"]]
        assert info["id"] >= len(base)
        assert info["pieces"] == base.tokenize(word) and len(info["pieces"]) >= cfg.tokenize.extend_vocab.min_pieces
        assert info["piece_ids"] == base.convert_tokens_to_ids(info["pieces"])
    word = next(iter(new))
    assert tok.tokenize(word + "s") == [word, "##s"]  # still WordPiece: continuation pieces work
    frag = report.fragmentation
    assert frag.pieces_per_domain_word_final is not None and frag.pieces_per_domain_word_base is not None
    assert frag.pieces_per_word_final is not None and frag.pieces_per_word_base is not None
    assert frag.pieces_per_domain_word_final < frag.pieces_per_domain_word_base
    assert frag.pieces_per_word_final < frag.pieces_per_word_base


def test_packing_keeps_every_token_without_padding(tokenized) -> None:
    cfg, paths, report = tokenized
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    L = cfg.tokenize.max_seq_length
    for split in ("train", "validation"):
        ds = _blocks(paths, split)
        rows = ds["input_ids"]
        assert all(len(r) == L for r in rows[:-1]) and 2 < len(rows[-1]) <= L
        assert all(r[0] == tok.cls_token_id and r[-1] == tok.sep_token_id for r in rows)
        assert not any(tok.pad_token_id in r for r in rows)
        stream = [t for r in rows for t in r[1:-1]]
        texts = corpus_texts(paths, split)
        expected: list[int] = []
        for enc in raw_backend(tok).encode_batch(texts, add_special_tokens=False):
            expected += [*enc.ids, tok.sep_token_id]
        assert stream == expected[:-1]
        masks = ds["special_tokens_mask"]
        assert all(
            m == [int(t in (tok.cls_token_id, tok.sep_token_id)) for t in r] for r, m in zip(rows, masks, strict=True)
        )
        assert report.corpus[split].tokens == len(expected) - len(texts)


def test_whole_word_ids_english(base) -> None:
    seg = WordSegmenter("en", None)
    enc = raw_backend(base).encode("Kestxevir cured pelvoid dermatosis.", add_special_tokens=False)
    ids = seg.word_ids("Kestxevir cured pelvoid dermatosis.", enc)
    pieces = enc.tokens
    assert pieces[0] != "kestxevir" and pieces[1].startswith("##")  # the base vocab splits it into ## pieces
    for i, p in enumerate(pieces):
        if p.startswith("##"):
            assert ids[i] == ids[i - 1]
        elif i:
            assert ids[i] == ids[i - 1] + 1
    assert ids[0] == 0 and ids[-1] == 4  # kestxevir, cured, pelvoid, dermatosis, "."


def test_whole_word_ids_chinese_follow_jieba(base) -> None:
    seg = WordSegmenter("zh", None)
    text = "我爱北京天安门"
    import jieba

    words = [w for w, _, _ in jieba.tokenize(text)]
    assert words == ["我", "爱", "北京", "天安门"]
    enc = raw_backend(base).encode(text, add_special_tokens=False)  # one token per character
    assert seg.word_ids(text, enc).tolist() == [0, 1, 2, 2, 3, 3, 3]


def test_whole_word_blocks_carry_block_local_word_ids(project) -> None:
    cfg, paths = project
    validate.run(cfg, paths)
    cfg_ww = make_config(**{"tokenize.whole_word": True, "tokenize.extend_vocab.enabled": False})
    tokenize.run(cfg_ww, paths)
    ds = _blocks(paths, "train")
    for ids, words, special in zip(
        ds["input_ids"][:20], ds["word_ids"][:20], ds["special_tokens_mask"][:20], strict=True
    ):
        w = np.array(words)
        assert (w[np.array(special) == 1] == -1).all()
        inner = w[w >= 0]
        assert inner[0] == 0 and (np.diff(inner) >= 0).all() and (np.diff(inner) <= 1).all()
        assert len(ids) == len(words)


def test_scratch_vocab_trains_and_round_trips(tmp_path: Path, project) -> None:
    cfg, paths = project
    validate.run(cfg, paths)
    cfg_s = make_config(
        **{
            "tokenize.mode": "wordpiece_scratch",
            "tokenize.extend_vocab.enabled": False,
            "tokenize.scratch.vocab_size": 1500,
        }
    )
    report = tokenize.run(cfg_s, paths)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    assert len(tok) <= 1500 and report.vocab_size == len(tok)
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    text = "Kestxevir 40 mg twice daily improved symptom resolution in pelvoid dermatosis."
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text.lower()
    assert report.unk_share < 0.001


def test_scratch_vocab_smaller_than_alphabet_fails(project) -> None:
    _cfg, paths = project
    cfg_s = make_config(
        **{
            "tokenize.mode": "wordpiece_scratch",
            "tokenize.extend_vocab.enabled": False,
            "tokenize.scratch.vocab_size": 20,
        }
    )
    with pytest.raises(
        ConfigError, match=r"vocab_size=20 is smaller than the 5 special tokens plus the \d+ characters"
    ):
        tokenize.run(cfg_s, paths)


def test_ner_alignment_first_subtoken_and_label_all(base) -> None:
    tags = ["B-DRUG", "O"]
    labels = {"O": 0, "B-DRUG": 1, "I-DRUG": 2}
    enc = base([["Kestxevir", "helps"]], is_split_into_words=True)
    n_pieces = len(base.tokenize("Kestxevir"))
    first = align_token_labels(enc.word_ids(0), [labels[t] for t in tags], False, {1: 2})
    assert first == [IGNORE, 1] + [IGNORE] * (n_pieces - 1) + [0, IGNORE]
    every = align_token_labels(enc.word_ids(0), [labels[t] for t in tags], True, {1: 2})
    assert every == [IGNORE, 1] + [2] * (n_pieces - 1) + [0, IGNORE]


def _qa_rows(context: str, answer: str) -> list[dict]:
    start = context.index(answer)
    return [
        {
            "id": "x",
            "question": "What dose was given?",
            "context": context,
            "answer_texts": [answer],
            "answer_starts": [start],
            "source_file": "qa.jsonl",
            "source_line": 7,
        }
    ]


def test_qa_positions_and_windows(base) -> None:
    meta = {"name": "qa", "type": "extractive_qa", "labels": []}
    cfg = make_config(**{"tokenize.max_seq_length": 32, "tokenize.doc_stride": 8}).tokenize
    context = (
        " ".join(f"Sentence {i} says nothing at all." for i in range(12)) + " Patients took 40 mg twice daily. The end."
    )
    cols = encode_task_split(base, meta, _qa_rows(context, "40 mg twice daily"), cfg)
    assert len(cols["input_ids"]) > 2  # several windows with stride
    found = [
        (s, e, ids)
        for s, e, ids in zip(cols["start_positions"], cols["end_positions"], cols["input_ids"], strict=True)
        if s
    ]
    assert found, "one window holds the answer"
    for s, e, ids in found:
        assert base.decode(ids[s : e + 1]) == "40 mg twice daily"
    assert any(
        s == 0 and e == 0 for s, e in zip(cols["start_positions"], cols["end_positions"], strict=True)
    )  # CLS elsewhere
    i = cols["start_positions"].index(found[0][0])
    assert context[cols["offset_start"][i][found[0][0]] : cols["offset_end"][i][found[0][1]]] == "40 mg twice daily"
    assert set(cols["example_id"]) == {"x"}


def test_qa_answer_outside_context_fails(base) -> None:
    meta = {"name": "qa", "type": "extractive_qa", "labels": []}
    rows = _qa_rows("A short context.", "short")
    rows[0]["answer_starts"] = [40]
    with pytest.raises(DataError, match=r"qa.jsonl:7: \[answer-outside-context\] task 'qa'"):
        encode_task_split(base, meta, rows, make_config().tokenize)


def test_unknown_label_fails(base) -> None:
    meta = {"name": "role", "type": "sequence_classification", "labels": ["A", "B"]}
    rows = [{"id": "1", "text": "x", "label": "C", "source_file": "role.csv", "source_line": 3}]
    with pytest.raises(DataError, match=r"role.csv:3: \[unknown-label\] task 'role': label 'C'"):
        encode_task_split(base, meta, rows, make_config().tokenize)


def test_missing_base_tokenizer_fails(project, tmp_path: Path) -> None:
    _cfg, paths = project
    bad = make_config(**{"tokenize.base_tokenizer": str(tmp_path / "no-such-model")})
    with pytest.raises(DataError, match=r"\[missing-model\] tokenize.base_tokenizer"):
        tokenize.run(bad, paths)


def test_max_seq_length_above_model_positions_fails(project) -> None:
    _cfg, paths = project
    with pytest.raises(ConfigError, match=r"max_seq_length=1024 exceeds .*max_position_embeddings=512"):
        tokenize.run(make_config(**{"tokenize.max_seq_length": 1024}), paths)


def test_chinese_without_jieba_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "jieba", None)  # makes `import jieba` raise ImportError
    with pytest.raises(ConfigError, match="language: zh needs the jieba package"):
        WordSegmenter("zh", None)


def test_sentence_pairs(project) -> None:
    cfg, paths = project
    validate.run(cfg, paths)
    cfg_p = make_config(**{"tokenize.sentence_pairs": True})
    report = tokenize.run(cfg_p, paths)
    ds = _blocks(paths, "train_pairs")
    assert len(ds) == report.corpus["train"].pairs > 0
    budget = cfg_p.tokenize.max_seq_length - 3
    assert all(a and b and len(a) + len(b) <= budget for a, b in zip(ds["a_ids"], ds["b_ids"], strict=True))


def test_a_vocabulary_that_does_not_cover_the_corpus_is_named_with_what_to_change(project) -> None:
    """Chinese text under the English MiniLM vocabulary: mostly [UNK], said on the console and in the report."""
    cfg, paths = project
    for file in paths.corpus.rglob("*.parquet"):  # the ingested corpus rewritten in a script the vocabulary lacks
        table = pq.read_table(file)
        chinese = ["研究显示新药可以缓解慢性疼痛患者的症状" * 3] * table.num_rows
        pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", [chinese]), file)
    manifest = json.loads((paths.corpus / "manifest.json").read_text())  # as ingest records what it wrote
    for shard in manifest["shards"]:
        shard["sha256"] = file_digest(paths.corpus / shard["file"])
    (paths.corpus / "manifest.json").write_text(json.dumps(manifest))
    validate.run(cfg, paths)
    report = tokenize.run(cfg, paths)
    assert report.unk_share > 0.5 and report.warning is not None
    assert report.warning.startswith(f"{report.unk_share:.1%} of the corpus tokens are [UNK]")
    assert "tokenize.mode: wordpiece_scratch" in report.warning
    shown = tokenize.summary(report, cfg, paths)
    assert f"warning: {report.warning}" in shown.splitlines()


def test_a_covering_vocabulary_writes_no_warning(tokenized) -> None:
    cfg, paths, report = tokenized
    assert report.unk_share < tokenize.UNK_WARN_SHARE and "warning" not in report.as_json()
    assert "warning" not in tokenize.summary(report, cfg, paths)
