"""Near-duplicate detection over word n-grams: inside the corpus, and against the evaluation texts.

Texts are compared as **sets of word n-grams** ("shingles"): casefolded, split into runs of
letters and digits (punctuation and spacing never count, so a re-cased or re-spaced copy has the
same shingles).

Two uses, both linear in the corpus:

- :class:`NearDuplicateIndex`: a corpus document whose Jaccard with an *earlier kept* document
  reaches ``threshold`` is a near-duplicate (the first copy stays), Jaccard estimated from MinHash
  signatures (rensa, in Rust) and found through LSH banding (candidates share one band of the
  signature). Memory: one signature (``num_perm`` x 4 bytes) and ``bands`` dictionary entries per
  kept document, never the text.
- :class:`EvaluationIndex`: the sentences of every task's validation and test inputs; a corpus
  document one of whose sentences holds at least ``threshold`` of an evaluation sentence's
  shingles (containment, exact) is contaminated. Jaccard of the two sentences, the rule before,
  was blind where it matters most: one changed word in an 8-word sentence leaves a Jaccard of
  0.56, and a copy inside a longer sentence less (it caught 0% of planted one-word edits of
  8-11-word biomed test sentences; containment at 0.7 catches 96-100%: BENCHMARKS.md). The match must
  also hold that share of the evaluation sentence's rare shingles, so that boilerplate does not match on
  its common ones alone.

Why not the libraries' own LSH classes: rensa's ``RMinHashLSH`` and datasketch's ``MinHashLSH``
index only their own MinHash objects, built one text at a time from strings; hashing a whole batch
of texts in NumPy and sketching it in one rensa call is what makes this fast (BENCHMARKS.md,
"ingest: near-duplicates"). The banding itself is a few lines below.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_WORD_BYTE = np.zeros(256, dtype=bool)  # ASCII letters and digits, and every byte of a non-ASCII character
_WORD_BYTE[[*range(48, 58), *range(65, 91), *range(97, 123), *range(128, 256)]] = True
_STOP = np.zeros(256, dtype=bool)
_STOP[[ord(c) for c in ".!?"]] = True
VOCABULARY_BITS = 1 << 24  # size of the evaluation shingles' bit table (16 MB)
_WORD_PRIME = np.uint64(0x100000001B3)  # FNV-1a's 64-bit prime: bytes -> word hash
_SHINGLE_PRIME = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio): words -> n-gram hash
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?\u3002\uff01\uff1f\uff0e])\s+")  # the sentences words_of finds, as strings
# Chinese and Japanese write no spaces between words: each ideograph or kana counts as a word (2-word shingles are
# then character bigrams, as text-dedup shingles CJK text), the full stops end a sentence like ". ", and the
# other CJK and full-width punctuation separates like a space
_CJK_CHARACTER = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_CJK_PUNCTUATION = re.compile(r"[\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
_CJK_STOP_UNSPACED = re.compile(r"(?<=[\u3002\uff01\uff1f\uff0e])(?!\s)")  # a CJK full stop, no space after
_CJK_ANY = re.compile(f"{_CJK_CHARACTER.pattern}|{_CJK_PUNCTUATION.pattern}")
_CJK_STOPS = str.maketrans({"\u3002": ". ", "\uff01": "! ", "\uff1f": "? ", "\uff0e": ". "})  # 。！？．
_BAND_PRIME = np.uint64(0xC2B2AE3D27D4EB4F)  # another odd constant: signature rows -> band key
SIG_BLOCK = 1 << 16  # signatures per block of the near-duplicate index (32 MB at 128 permutations)


@dataclass(frozen=True)
class Words:
    """The words of a batch of texts as 64-bit hashes, with text and sentence boundaries (word indices)."""

    hashes: np.ndarray  # uint64, one per word, texts one after the other
    text_offsets: np.ndarray  # int64, len(texts) + 1: words of text i are hashes[off[i]:off[i + 1]]
    sentence_offsets: np.ndarray  # int64: the same for sentences (every text boundary is one)
    sentence_text: np.ndarray  # int64, one per sentence: the text it belongs to


def spaced(text: str) -> str:
    """``text`` with each CJK character a word of its own and CJK punctuation as ASCII's (ASCII text as it is)."""
    if text.isascii() or not _CJK_ANY.search(text):  # the common cases: one C-level scan each
        return text
    return _CJK_CHARACTER.sub(r" \g<0> ", _CJK_PUNCTUATION.sub(" ", text.translate(_CJK_STOPS)))


def _may_hold_cjk(utf8: bytes) -> bool:
    """Whether ``utf8`` has a lead byte of U+3000..U+9FFF (0xE3-0xE9) or U+F000..U+FFFF (0xEF): one NumPy pass."""
    lead = np.frombuffer(utf8, dtype=np.uint8)
    return bool(((lead >= 0xE3) & (lead <= 0xE9)).any() or (lead == 0xEF).any())


def words_of(texts: Sequence[str]) -> Words:
    """Hash every word of ``texts`` (ASCII-lowercased; runs of letters/digits; a CJK character is one word)
    in a few vectorised passes.

    A sentence ends where ``.``, ``!`` or ``?`` is followed by a space (as ``re.split(r"(?<=[.!?])\\s+")``
    cuts), at ``。``, ``！`` or ``？``, and at the end of each text. The hash is FNV-style over the word's
    UTF-8 bytes, stable across processes and machines.
    """
    # ASCII case folding on the bytes (bytes.lower: ~20x faster than str.casefold on a batch of articles)
    joined = "\n".join(t.replace("\n", " ") for t in texts).encode("utf-8")
    if _may_hold_cjk(joined):  # else the batch is read as it is, without a second join and a regex scan per text
        joined = "\n".join(spaced(t).replace("\n", " ") for t in texts).encode("utf-8")
    buf = np.frombuffer(joined.lower(), dtype=np.uint8)
    is_word = _WORD_BYTE[buf]
    edges = np.diff(np.concatenate(([False], is_word, [False])).astype(np.int8))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    hashes = _hash_spans(buf, starts, ends - starts)
    # text boundaries: the "\n" joints; a word belongs to text t when it starts after t joints
    joints = np.flatnonzero(buf == 10)
    text_of_word = np.searchsorted(joints, starts)
    text_offsets = np.searchsorted(text_of_word, np.arange(len(texts) + 1))
    # sentence ends: the separator run after a word holds ". " (or "!", "?") or a text joint ("\n")
    after = np.concatenate((starts[1:], [len(buf)]))
    ends_sentence = np.zeros(len(starts), dtype=bool)
    if len(starts):
        nxt = np.concatenate((buf[1:], [10]))
        stops = np.flatnonzero((_STOP[buf] & ((nxt == 32) | (nxt == 10))) | (buf == 10))
        ends_sentence = np.searchsorted(stops, after) > np.searchsorted(stops, ends)
        ends_sentence[-1] = True
    sentence_offsets = np.unique(np.concatenate(([0], np.flatnonzero(ends_sentence) + 1, text_offsets)))
    sentence_text = np.searchsorted(text_offsets, sentence_offsets[:-1], side="right") - 1
    return Words(hashes, text_offsets.astype(np.int64), sentence_offsets.astype(np.int64), sentence_text)


def _hash_spans(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each byte span ``buf[start:start + length]``, 8 bytes at a time.

    The bytes are read as little-endian uint64 words through a 1-byte-strided view (an unaligned
    read per word, no copy), the bytes past the span masked off, and folded in with a multiply;
    the length is mixed in and splitmix64's finaliser spreads the bits.
    """
    padded = np.concatenate((buf, np.zeros(8, dtype=np.uint8)))
    words8 = np.ndarray(shape=(len(buf),), dtype=np.uint64, buffer=padded.data, strides=(1,))
    hashes = lengths.astype(np.uint64) * _SHINGLE_PRIME
    active = np.arange(len(starts))
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64, as a hash should
        for chunk in range(0, int(lengths.max(initial=0)), 8):
            active = active[lengths[active] > chunk]  # after the first chunks, only long words are left
            left = np.minimum(lengths[active] - chunk, 8).astype(np.uint64)
            mask = np.where(
                left >= 8, np.uint64(0xFFFFFFFFFFFFFFFF), (np.uint64(1) << (left * np.uint64(8))) - np.uint64(1)
            )
            hashes[active] = (hashes[active] ^ (words8[starts[active] + chunk] & mask)) * _WORD_PRIME
        hashes ^= hashes >> np.uint64(30)
        hashes *= np.uint64(0xBF58476D1CE4E5B9)
        hashes ^= hashes >> np.uint64(27)
        hashes *= np.uint64(0x94D049BB133111EB)
        hashes ^= hashes >> np.uint64(31)
    return hashes


def shingles(word_hashes: np.ndarray, offsets: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Word ``n``-gram hashes of every segment (``offsets`` into ``word_hashes``) and their row offsets.

    A segment shorter than ``n`` words gives one shingle of all its words; an empty one gives none.
    """
    lengths = np.diff(offsets)
    seg_end = np.repeat(offsets[1:], lengths)  # per word: where its segment ends
    grams = word_hashes.copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):
            pos = np.arange(len(grams))
            inside = pos + k < seg_end
            grams[inside] = grams[inside] * _SHINGLE_PRIME + word_hashes[pos[inside] + k]
    pos = np.arange(len(grams))
    seg_start = np.repeat(offsets[:-1], lengths)
    keep = (pos + n <= seg_end) | ((pos == seg_start) & (seg_end - seg_start < n))
    counts = np.where(lengths >= n, lengths - n + 1, np.minimum(lengths, 1))
    return grams[keep], np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def signatures(flat: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """MinHash signatures (rows x ``num_perm``, uint32) of the shingle rows, computed by rensa in one call."""
    import rensa

    if len(offsets) <= 1:
        return np.zeros((0, num_perm), dtype=np.uint32)
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(
        np.ascontiguousarray(flat, dtype=np.uint64), offsets.astype(np.uint64), num_perm, seed
    )
    return np.asarray(matrix.to_rows(), dtype=np.uint32).reshape(-1, num_perm)


def lsh_bands(threshold: float, num_perm: int, false_negative_weight: float = 0.9) -> tuple[int, int]:
    """``(bands, rows)`` with bands x rows <= num_perm that minimise the weighted false positive and false
    negative probability mass around ``threshold`` (datasketch's ``_optimal_param``). False negatives weigh
    more: a missed near-copy stays in the corpus, while a false candidate only costs one signature check."""
    s = np.linspace(0.0, 1.0, 201)
    best, best_cost = (1, num_perm), math.inf
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            p = 1.0 - (1.0 - s**rows) ** bands  # probability that two texts at Jaccard s become candidates
            weights = np.where(s < threshold, 1.0 - false_negative_weight, false_negative_weight)
            cost = np.trapezoid(weights * np.where(s < threshold, p, 1.0 - p), s)
            if cost < best_cost:
                best, best_cost = (bands, rows), cost
    return best


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit key per band of each signature (rows x bands); equal keys: that band is equal."""
    keys = np.zeros((len(sigs), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for r in range(rows):
            keys = keys * _BAND_PRIME + sigs[:, r::rows][:, :bands].astype(np.uint64)
    return keys + np.arange(bands, dtype=np.uint64)  # the band's number, so band 1 never meets band 2


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The MinHash estimate of Jaccard: the share of equal signature entries (``b`` may be a matrix)."""
    return (a == b).mean(axis=-1)


class FirstSeen:
    """uint64 key -> the first number (< 2**31) stored under it, in 12 bytes per key (a dict entry takes ~100).

    Keys live in a few sorted NumPy runs, looked up for a whole batch at once (:meth:`in_runs`), and the latest
    ones in a small dict (:attr:`recent`) that :meth:`seal` turns into a run; runs of similar size are merged, so
    there are O(log n) of them. Why not a library: a sorted-array LSM of integer keys is a few lines, and the
    on-disk key-value stores (LMDB, RocksDB) would answer one key per call, far slower than one searchsorted.
    """

    def __init__(self, spill: int = 1 << 18, filter_bits: int = 20) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted uint64 keys, int32 numbers)
        self.recent: dict[int, int] = {}
        self.spill = spill  # keys in ``recent`` before it becomes a run
        self.stored = 0  # keys in the runs
        # a bit per slot of the keys' top ``filter_bits`` bits, set for every key in the runs (no false negatives): most
        # keys of a batch are new, and the bit says so without a binary search through every run. It grows to keep
        # >= 8 bits per stored key (~12% of new keys pass it), up to 2**32 bits (512 MB).
        self.filter_bits = filter_bits
        self.filter = np.zeros(1 << (filter_bits - 3), dtype=np.uint8)

    def in_runs(self, keys: np.ndarray) -> np.ndarray:
        """The number stored under each of ``keys`` (any shape) in the runs, or -1 (``recent`` is not looked at)."""
        flat = keys.reshape(-1)
        found = np.full(flat.size, -1, dtype=np.int64)
        maybe = np.flatnonzero(self.may_hold(flat))
        order = maybe[np.argsort(flat[maybe])]
        needles = flat[order]  # sorted: searchsorted walks each run forward, ~4x faster than at random
        for run_keys, numbers in self.runs:
            at = np.minimum(np.searchsorted(run_keys, needles), len(run_keys) - 1)
            hit = run_keys[at] == needles
            found[order[hit]] = numbers[at[hit]]  # a key is stored once: no run overrides another
        return found.reshape(keys.shape)

    def may_hold(self, keys: np.ndarray) -> np.ndarray:
        """False where a key is certainly in no run (its filter bit is clear)."""
        slot = keys >> np.uint64(64 - self.filter_bits)
        return (
            (self.filter[(slot >> np.uint64(3)).astype(np.int64)] >> (slot & np.uint64(7)).astype(np.uint8)) & 1
        ) > 0

    def mark(self, keys: np.ndarray) -> None:
        slot = keys >> np.uint64(64 - self.filter_bits)
        bits = np.left_shift(np.uint8(1), (slot & np.uint64(7)).astype(np.uint8))
        np.bitwise_or.at(self.filter, (slot >> np.uint64(3)).astype(np.int64), bits)

    def seal(self) -> None:
        """Turn ``recent`` into a sorted run (once it holds ``spill`` keys) and merge runs of similar size."""
        if len(self.recent) < self.spill:
            return
        keys = np.fromiter(self.recent.keys(), dtype=np.uint64, count=len(self.recent))
        numbers = np.fromiter(self.recent.values(), dtype=np.int32, count=len(self.recent))
        order = np.argsort(keys)
        self.runs.append((keys[order], numbers[order]))
        self.recent = {}
        self.stored += len(keys)
        while len(self.runs) > 1 and len(self.runs[-2][0]) <= 2 * len(self.runs[-1][0]):
            newer, older = self.runs.pop(), self.runs.pop()
            self.runs.append(merge_sorted(older, newer))
        if self.stored * 8 > 1 << self.filter_bits and self.filter_bits < 32:
            while self.stored * 8 > 1 << self.filter_bits and self.filter_bits < 32:
                self.filter_bits += 2
            self.filter = np.zeros(1 << (self.filter_bits - 3), dtype=np.uint8)
            for run_keys, _ in self.runs:
                self.mark(run_keys)
        else:
            self.mark(keys)


def merge_sorted(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs (disjoint keys) as one, written once into place (no argsort of the whole: memory 2x, not 4x)."""
    (ka, na), (kb, nb) = a, b
    at_b = np.searchsorted(ka, kb) + np.arange(len(kb))  # where each of b's keys lands in the merged run
    keys = np.empty(len(ka) + len(kb), dtype=np.uint64)
    numbers = np.empty(len(keys), dtype=np.int32)
    from_a = np.ones(len(keys), dtype=bool)
    from_a[at_b] = False
    keys[at_b], numbers[at_b] = kb, nb
    keys[from_a], numbers[from_a] = ka, na
    return keys, numbers


class NearDuplicateIndex:
    """Corpus documents seen so far; :meth:`check_batch` says whether each new one near-duplicates a kept one.

    Memory per kept document: its signature (``num_perm`` x 4 bytes, in one growing matrix), its band keys
    (``bands`` x 12 bytes, :class:`FirstSeen`) and its id; about 0.75 KB with the defaults.
    """

    def __init__(self, threshold: float, shingle_words: int, num_perm: int, seed: int) -> None:
        self.threshold, self.n, self.num_perm, self.seed = threshold, shingle_words, num_perm, seed
        self.bands, self.rows = lsh_bands(threshold, num_perm)
        self.buckets = FirstSeen()  # band key -> the first kept document with it
        self.blocks: list[np.ndarray] = []  # signatures of kept documents, by their number, SIG_BLOCK rows a block
        self.count = 0
        self.ids: list[str] = []

    def check_batch(self, words: Words, ids: Sequence[str]) -> list[tuple[str, float] | None]:
        """For each text of ``words`` (:func:`words_of` the batch) in order: ``(id of the kept document it
        near-duplicates, Jaccard)`` or ``None``; a text that is no duplicate is added, so later texts of the
        batch are compared to it."""
        return self.check_sketches(*self.sketch(words), ids)

    def sketch(self, words: Words) -> tuple[np.ndarray, np.ndarray]:
        """The MinHash signatures (texts x ``num_perm``) and LSH band keys (texts x bands) of a batch's texts."""
        sigs = signatures(*shingles(words.hashes, words.text_offsets, self.n), self.num_perm, self.seed)
        return sigs, band_keys(sigs, self.bands, self.rows)

    def check_sketches(self, sigs: np.ndarray, keys: np.ndarray, ids: Sequence[str]) -> list[tuple[str, float] | None]:
        """:meth:`check_batch` for texts already sketched (:meth:`sketch`), in order."""
        out: list[tuple[str, float] | None] = []
        earlier = self.buckets.in_runs(keys)  # documents of earlier batches, one lookup for the batch
        # the common case, False: no key of the document is there
        in_runs: list[bool] = np.asarray((earlier >= 0).any(axis=1)).tolist()
        earlier_rows: list[list[int]] = earlier.tolist()
        recent = self.buckets.recent
        for i, (sig, doc_keys, doc_id) in enumerate(zip(sigs, keys.tolist(), ids, strict=True)):
            candidates = {recent[k] for k in doc_keys if k in recent}
            if in_runs[i]:
                candidates.update(c for c in earlier_rows[i] if c >= 0)
            best = max(((estimated_jaccard(sig, self.signature(c)), c) for c in candidates), default=(0.0, -1))
            if best[0] >= self.threshold:
                out.append((self.ids[best[1]], round(float(best[0]), 3)))
                continue
            self.keep(sig, doc_id)
            number = self.count - 1
            for k, c in zip(doc_keys, earlier_rows[i], strict=True) if in_runs[i] else ((k, -1) for k in doc_keys):
                if c < 0:
                    recent.setdefault(k, number)
            out.append(None)
        self.buckets.seal()
        return out

    def keep(self, sig: np.ndarray, doc_id: str) -> None:
        """Add a kept document's signature (in fixed blocks: growing never copies or doubles) and id."""
        if self.count % SIG_BLOCK == 0:
            self.blocks.append(np.empty((SIG_BLOCK, self.num_perm), dtype=np.uint32))  # pages touched as filled
        self.blocks[-1][self.count % SIG_BLOCK] = sig
        self.count += 1
        self.ids.append(doc_id)

    def signature(self, number: int) -> np.ndarray:
        return self.blocks[number // SIG_BLOCK][number % SIG_BLOCK]


@dataclass(frozen=True)
class Contamination:
    """A corpus sentence that holds (most of) an evaluation sentence."""

    task: str
    split: str
    evaluation_text: str
    corpus_sentence: str
    containment: float  # share of the evaluation sentence's shingles found in the corpus sentence


COMMON_MIN = 10  # a shingle held by this many evaluation sentences or fewer is rare, whatever common_share says
ANCHOR_HITS = 2  # anchors a candidate must hold (each sentence gets as many more than a match may miss)
WINDOW_WORDS = 128  # corpus sentences longer than this are read as windows of this many words, half overlapping
_SEGMENT_PRIME = np.uint64(0xD6E8FEB86659FD93)  # mixes a segment number into a shingle hash: one sorted key array


class EvaluationIndex:
    """The sentences of the tasks' validation and test inputs, to find near-copies of them in the corpus.

    A corpus sentence is contaminated by an evaluation sentence when it holds at least ``threshold`` of the
    evaluation sentence's distinct shingles (containment, as the large-model decontamination literature measures
    overlap with the benchmark's n-grams, not Jaccard: one changed word in an 8-word sentence keeps 5 of its 7
    bigrams, containment 0.71 but Jaccard 0.56, and a copy joined with other text keeps containment 1), and at
    least ``threshold`` of its *rare* shingles, those at most ``common_share`` of the evaluation sentences hold
    (or at most :data:`COMMON_MIN` of them): "between the two groups" tells no sentence from another, and a boilerplate
    sentence ("There was no significant difference in X between the two groups") matches on those alone. Exact:
    every pair that reaches the threshold is found. A corpus sentence only meets the evaluation sentences two of
    whose *anchors* it holds: each evaluation sentence's ``size - ceil(threshold x size) + 2`` rarest shingles
    (by how many evaluation sentences share them), of which a match, missing at most ``size - ceil(threshold x
    size)`` shingles, holds two (pigeonhole); the candidates are then counted exactly, with vectorised sorted-array
    lookups.
    """

    def __init__(
        self,
        texts: Sequence[tuple[str, str, str]],
        threshold: float,
        shingle_words: int,
        min_chars: int,
        common_share: float,
    ) -> None:
        """``texts``: ``(task, split, text)``; sentences under ``min_chars`` non-space characters are
        boilerplate (``P<0.05 was considered significant.``), not contamination, and are not indexed."""
        self.threshold, self.n = threshold, shingle_words
        words = words_of([t for _, _, t in texts])
        sentences = _sentence_strings([t for _, _, t in texts], words)
        long_enough = np.array([len("".join(s.split())) >= min_chars for s in sentences], dtype=bool)
        flat, offsets = shingles(words.hashes, words.sentence_offsets, self.n)
        rows = np.flatnonzero(long_enough & (np.diff(offsets) > 0))
        flat, offsets = _take_rows(flat, offsets, rows)
        self.sentences = [sentences[i] for i in rows]
        self.origin = [texts[words.sentence_text[i]][:2] for i in rows]
        # each sentence's distinct shingles (CSR: self.offsets into self.shingles)
        row_of = np.repeat(np.arange(len(rows)), np.diff(offsets))
        pairs = np.unique(np.stack([row_of.astype(np.uint64), flat]), axis=1) if len(flat) else np.zeros((2, 0))
        row_of, self.shingles = pairs[0].astype(np.int64), pairs[1].astype(np.uint64)
        _, inverse, df = np.unique(self.shingles, return_inverse=True, return_counts=True)
        self.df = df[inverse]  # per entry: how many evaluation sentences hold this shingle
        self.rare = self.df <= max(COMMON_MIN, common_share * len(rows))  # per entry
        self.counts = np.bincount(row_of, minlength=len(rows)).astype(np.int64)  # distinct shingles per sentence
        self.rare_counts = np.bincount(row_of, weights=self.rare, minlength=len(rows))
        self.offsets = np.concatenate(([0], np.cumsum(self.counts))).astype(np.int64)
        self.anchors, self.anchor_offsets, self.anchor_rows, self.required = self._anchor_postings(row_of)
        # the shingles and the anchors as bit tables on the hash's low bits (16 MB each): a corpus shingle goes on
        # to a sorted-array lookup only where its bit is set
        self.vocabulary = np.zeros(VOCABULARY_BITS, dtype=bool)
        self.vocabulary[_low_bits(self.shingles)] = True
        self.anchor_bits = np.zeros(VOCABULARY_BITS, dtype=bool)
        self.anchor_bits[_low_bits(self.anchors)] = True

    def _anchor_postings(self, row_of: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Sorted anchor shingles; for each (CSR: offsets, rows) the evaluation sentences it anchors; and per
        sentence how many of its anchors a match holds at least. A sentence's anchors are its ``count - ceil(threshold
        x count) + ANCHOR_HITS`` rarest shingles (all of them where it has fewer): :data:`ANCHOR_HITS` more than a
        match may miss."""
        order = np.lexsort((self.shingles, self.df, row_of))  # by sentence, rarest first, ties by hash
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order)) - self.offsets[row_of[order]]
        need = np.ceil(self.threshold * self.counts - 1e-9).astype(np.int64)  # shingles a match must hold
        may_miss = self.counts - need
        anchors = np.minimum(self.counts, may_miss + ANCHOR_HITS)
        required = anchors - may_miss  # anchors a match holds at least: ANCHOR_HITS, or all it must hold
        is_anchor = rank < anchors[row_of]
        anchor_keys, anchor_rows = self.shingles[is_anchor], row_of[is_anchor]
        by_key = np.argsort(anchor_keys, kind="stable")
        anchor_keys, anchor_rows = anchor_keys[by_key], anchor_rows[by_key]
        unique_keys, starts = np.unique(anchor_keys, return_index=True)
        return unique_keys, np.concatenate((starts, [len(anchor_keys)])).astype(np.int64), anchor_rows, required

    @property
    def size(self) -> int:
        """Evaluation sentences indexed."""
        return len(self.sentences)

    def contaminated(self, texts: Sequence[str], words: Words) -> list[Contamination | None]:
        """For each corpus text (``words``: :func:`words_of` them): the evaluation sentence that one of its
        sentences holds most of (at least ``threshold`` of its shingles), or ``None``."""
        out: list[Contamination | None] = [None] * len(texts)
        if not self.size or not texts:
            return out
        index, seg_offsets, seg_sentence = _windows(words.sentence_offsets, WINDOW_WORDS)
        flat, offsets = shingles(words.hashes if index is None else words.hashes[index], seg_offsets, self.n)
        seg_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        segments, rows = self._candidates(flat, seg_of)
        if not len(segments):
            return out
        scores = self._containment(flat, seg_of, segments, rows)
        hit = scores >= self.threshold - 1e-9
        segments, rows, scores = segments[hit], rows[hit], scores[hit]
        sentence = seg_sentence[segments]
        text_of = words.sentence_text[sentence]
        # per text its best pair (highest containment; the first sentence and evaluation sentence among equals)
        for k in np.lexsort((rows, sentence, -scores, text_of)).tolist():
            text = int(text_of[k])
            if out[text] is not None:
                continue
            i = int(rows[k])
            first = int(np.searchsorted(words.sentence_text, text))
            corpus = _sentence_strings([texts[text]], words_of([texts[text]]))[int(sentence[k]) - first]
            task, split = self.origin[i]
            out[text] = Contamination(task, split, self.sentences[i], corpus, round(float(scores[k]), 3))
        return out

    def _candidates(self, flat: np.ndarray, seg_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct (segment, evaluation sentence) pairs in which the segment holds one of the sentence's
        anchors."""
        maybe = np.flatnonzero(self.anchor_bits[_low_bits(flat)])
        pos = np.minimum(np.searchsorted(self.anchors, flat[maybe]), max(len(self.anchors) - 1, 0))
        hit = self.anchors[pos] == flat[maybe] if len(self.anchors) else np.zeros(len(maybe), dtype=bool)
        found, pos = maybe[hit], pos[hit]
        if not len(found):
            return found, found
        lengths = self.anchor_offsets[pos + 1] - self.anchor_offsets[pos]
        rows = self.anchor_rows[_ranges(self.anchor_offsets[pos], lengths)]
        segments = np.repeat(seg_of[found], lengths)
        pair, hits = np.unique(segments * np.int64(self.size) + rows, return_counts=True)
        pair = pair[hits >= self.required[pair % self.size]]
        return pair // self.size, pair % self.size

    def _containment(self, flat: np.ndarray, seg_of: np.ndarray, segments: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """For each (segment, evaluation sentence) pair: the lower of the shares of the sentence's shingles and of
        its rare shingles (those at most ``common_share`` of the sentences hold) that the segment holds (1 where
        it has no rare one)."""
        # the (shingle, segment) keys a candidate segment holds, of the shingles some sentence has (a bit table on
        # the hash's low bits: a false hit only adds a key no lookup asks for), sorted for the lookups
        in_candidate = np.zeros(int(seg_of[-1]) + 1, dtype=bool)
        in_candidate[segments] = True
        keep = in_candidate[seg_of] & self.vocabulary[_low_bits(flat)]
        with np.errstate(over="ignore"):
            held = np.sort(flat[keep] ^ (seg_of[keep].astype(np.uint64) * _SEGMENT_PRIME))
            lengths = self.counts[rows]
            entries = _ranges(self.offsets[rows], lengths)
            pair_of = np.repeat(np.arange(len(rows)), lengths)
            keys = self.shingles[entries] ^ (segments[pair_of].astype(np.uint64) * _SEGMENT_PRIME)
        pos = np.minimum(np.searchsorted(held, keys), len(held) - 1)
        found = held[pos] == keys
        share = np.bincount(pair_of, weights=found, minlength=len(rows)) / lengths
        rare_found = np.bincount(pair_of, weights=found & self.rare[entries], minlength=len(rows))
        rare = self.rare_counts[rows]
        return np.minimum(share, np.where(rare > 0, rare_found / np.maximum(rare, 1), 1.0))


def _low_bits(hashes: np.ndarray) -> np.ndarray:
    """The slots of ``hashes`` in a bit table of :data:`VOCABULARY_BITS` entries (their low bits)."""
    return (hashes & np.uint64(VOCABULARY_BITS - 1)).astype(np.int64)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``start .. start + length - 1`` of every range, concatenated (a vectorised CSR gather)."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(total) - np.repeat(ends - lengths, lengths) + np.repeat(starts, lengths)


def _windows(offsets: np.ndarray, width: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Segments of the sentences ``offsets`` marks (word indices): each sentence, or for one over ``width`` words
    windows of ``width`` words every ``width // 2`` (an evaluation sentence of up to ``width // 2`` words lies whole
    in one of them, and a long run-on text never counts as one bag of shingles). Returns the word indices the
    segments are read from (``None``: the words as they are), the segments' offsets into them, and each segment's
    sentence."""
    lengths = np.diff(offsets)
    if not (lengths > width).any():  # the common case: every sentence is one segment
        return None, offsets, np.arange(len(lengths))
    step = max(1, width // 2)
    count = np.where(lengths > width, np.ceil((lengths - width) / step).astype(np.int64) + 1, 1)
    sentence = np.repeat(np.arange(len(lengths)), count)
    k = np.arange(len(sentence)) - np.repeat(np.cumsum(count) - count, count)
    starts = offsets[:-1][sentence] + k * step
    ends = np.minimum(starts + width, offsets[1:][sentence])
    seg_lengths = ends - starts
    return _ranges(starts, seg_lengths), np.concatenate(([0], np.cumsum(seg_lengths))).astype(np.int64), sentence


def _take_rows(flat: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The shingle rows ``rows`` of ``(flat, offsets)`` as a new ``(flat, offsets)``."""
    lengths = np.diff(offsets)[rows]
    if not len(rows):
        return flat[:0], np.zeros(1, dtype=np.int64)
    index = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in rows.tolist()])
    return flat[index], np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)


def _unspaced_stops(text: str) -> str:
    """``text`` with a space after each CJK full stop, so that ``_SENTENCE_SPLIT`` cuts where :func:`words_of`
    does; the sentences stay as written (for reports)."""
    return text if text.isascii() else _CJK_STOP_UNSPACED.sub(" ", text)


def _sentence_strings(texts: Sequence[str], words: Words) -> list[str]:
    """The sentences of ``texts`` as strings, in the order of ``words.sentence_offsets`` (for reports)."""
    out: list[str] = []
    for i, text in enumerate(texts):
        pieces = [
            p
            for p in _SENTENCE_SPLIT.split(_unspaced_stops(text))
            if any((ch.isascii() and ch.isalnum()) or ord(ch) > 127 for ch in p)
        ]
        want = int(np.sum(words.sentence_text == i))
        # the regex and the byte scan agree on ordinary text; where they do not, pad or join the tail
        if len(pieces) < want:
            pieces += [""] * (want - len(pieces))
        elif len(pieces) > want:
            pieces = [*pieces[: want - 1], " ".join(pieces[want - 1 :])] if want else []
        out.extend(pieces)
    return out
