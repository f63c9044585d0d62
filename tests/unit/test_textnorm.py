"""Normalisation, hashing and split stability."""

from __future__ import annotations

import random

from pipeline.text.textnorm import normalize_text, normalize_with_spans, split_of, text_hash


def test_normalize_folds_controls_invisibles_and_whitespace() -> None:
    raw = "  ﬁnal\u200b dose:\x00 10\u00a0mg\t\n\r\x1f tw\u00adice daily  "
    assert normalize_text(raw, "NFKC") == "final dose: 10 mg twice daily"
    assert normalize_text(raw, "NFC").startswith("ﬁnal")  # NFC keeps compatibility ligatures


def test_normalize_composes_accents() -> None:
    assert normalize_text("cafe\u0301", "NFC") == "caf\u00e9"


def test_spans_survive_normalisation() -> None:
    text = "  The  dose was\u200b 5\u00a0µg  twice\n\ndaily ."
    start = text.index("5\u00a0µg")
    out, spans = normalize_with_spans(text, [(start, start + len("5\u00a0µg"))], "NFKC")
    s, e = spans[0]
    assert out == "The dose was 5 μg twice daily ."
    assert out[s:e] == normalize_text("5\u00a0µg", "NFKC") == "5 μg"


def test_spans_at_text_edges() -> None:
    out, spans = normalize_with_spans("answer here", [(0, 6), (7, 11)])
    assert [out[s:e] for s, e in spans] == ["answer", "here"]


def test_hash_is_stable_and_64_bit() -> None:
    assert text_hash("abc") == text_hash("abc")
    assert text_hash("abc") != text_hash("abd")
    assert 0 <= text_hash("abc") < 2**64


def test_split_depends_on_the_text_only() -> None:
    rng = random.Random(0)
    docs = [f"document {rng.random()}" for _ in range(2000)]
    before = {d: split_of(d, 0.1) for d in docs}
    more = docs + [f"new document {i}" for i in range(5000)]
    rng.shuffle(more)
    after = {d: split_of(d, 0.1) for d in more}
    assert all(after[d] == s for d, s in before.items())
    share = sum(s == "validation" for s in before.values()) / len(before)
    assert 0.07 < share < 0.13
