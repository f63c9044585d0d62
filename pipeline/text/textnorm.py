"""Text normalisation shared by the corpus and the task data.

Steps, in order: Unicode normalisation (NFC or NFKC), removal of control and invisible format
characters, and whitespace collapse (every run of Unicode whitespace becomes one space, ends
trimmed). Extractive QA needs character offsets to survive this, hence
:func:`normalize_with_spans`.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from itertools import pairwise
from typing import Literal

NormalForm = Literal["NFC", "NFD", "NFKC", "NFKD"]  # unicodedata.normalize's forms

# Characters deleted outright: C0/C1 controls other than whitespace (whitespace is collapsed,
# not deleted), plus the invisible ones that silently split words: zero-width space, BOM,
# soft hyphen. All of them are non-printable, which gives a fast path for clean text.
_DELETE = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\u200b\ufeff\u00ad]")


def normalize_text(text: str, form: NormalForm = "NFKC") -> str:
    """Return ``text`` Unicode-normalised, stripped of control characters, whitespace collapsed.

    Collapsing uses ``str.split`` (every Unicode whitespace run becomes one space) and the
    deletion regex only runs on the rare texts that hold a non-printable character: both are
    several times faster than regex substitution over every document.
    """
    text = unicodedata.normalize(form, text)
    if text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " ":
        return text  # already clean: the common case, checked at C speed
    text = " ".join(text.split())
    if not text.isprintable():
        text = " ".join(_DELETE.sub("", text).split())
    return text


def text_hash(text: str) -> int:
    """A stable 64-bit hash of a (normalised) text, for dedup and hash-based splits."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def split_of(text: str, validation_fraction: float) -> str:
    """``"validation"`` or ``"train"``, decided by the text's hash alone.

    Adding or removing other documents never moves this one across splits.
    """
    return split_of_hash(text_hash(text), validation_fraction)


def split_of_hash(h: int, validation_fraction: float) -> str:
    """:func:`split_of` for an already computed :func:`text_hash`."""
    return "validation" if h % 1_000_000 < validation_fraction * 1_000_000 else "train"


def normalize_with_spans(
    text: str, spans: list[tuple[int, int]], form: NormalForm = "NFKC"
) -> tuple[str, list[tuple[int, int]]]:
    """Normalise ``text`` like :func:`normalize_text` and map character spans onto the result.

    The text is cut at every span boundary and each piece is Unicode-normalised on its own, so
    a boundary never falls inside a composed character; whitespace collapse then runs over the
    whole string while tracking where every original piece lands. A span that lies outside the
    text keeps its length and is mapped as well as possible (validation then reports it).
    """
    cuts = sorted({0, len(text), *(max(0, min(len(text), p)) for s in spans for p in s)})
    pieces = [unicodedata.normalize(form, text[a:b]) for a, b in pairwise(cuts)]
    pieces = [_DELETE.sub("", p) for p in pieces]
    # new_at[cut] = index in the joined, not yet collapsed string where that cut lands
    joined_at = {}
    pos = 0
    for cut, piece in zip(cuts, pieces, strict=False):
        joined_at[cut] = pos
        pos += len(piece)
    joined_at[cuts[-1]] = pos
    joined = "".join(pieces)
    # collapse whitespace, recording for each joined index its index in the output
    out: list[str] = []
    index_map = [0] * (len(joined) + 1)
    in_space = True  # leading whitespace is dropped
    for i, ch in enumerate(joined):
        index_map[i] = len(out)
        if ch.isspace():
            if not in_space:
                out.append(" ")
            in_space = True
        else:
            out.append(ch)
            in_space = False
    index_map[len(joined)] = len(out)
    result = "".join(out)
    stripped = result.rstrip(" ")
    mapped = []
    for start, end in spans:
        s = index_map[joined_at[max(0, min(len(text), start))]]
        e = index_map[joined_at[max(0, min(len(text), end))]]
        # a span never starts on the space the collapse kept before it, nor ends after one
        while s < e and s < len(result) and result[s] == " ":
            s += 1
        while e > s and result[e - 1] == " ":
            e -= 1
        mapped.append((min(s, len(stripped)), min(e, len(stripped))))
    return stripped, mapped
