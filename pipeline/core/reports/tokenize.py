"""``reports/tokenize.json``: the vocabulary, what was packed into blocks (the corpus splits and the tasks' own train
inputs, TAPT's text), how the tasks were encoded, how finely words break into pieces, and the packing speed.

Timings and speeds (``seconds``, ``pack_tokens_per_s``, ``pack_mb_per_s``) are the measured half
(``reports/measured/``). Fields are declared in the order the stage writes them: a report is rewritten byte for byte.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.reports.base import StageReport


class Packed(StageReport):
    """A corpus split (or the tasks' train inputs) packed into blocks. A split with no documents has only
    ``shards: 0``."""

    shards: int | None = None  # corpus splits only
    documents: int = 0
    characters: int = 0
    tokens: int = 0  # the documents' tokens, without the separators
    blocks: int = 0
    unk_tokens: int = 0
    pairs: int | None = None  # tokenize.sentence_pairs: the A/B pairs packed beside the blocks


class Encoded(StageReport):
    """A task split as the fine-tuning reads it: examples, features (windows for long texts), how many were cut."""

    examples: int
    features: int
    truncated: int | None  # None: long texts as windows, nothing cut at max_seq_length
    mean_tokens: float


class Fragmentation(StageReport):
    """Mean pieces per word (frequency-weighted) under the base and the final vocabulary, all words and domain terms."""

    distinct_words: int
    pieces_per_word_base: float | None  # None: no alphabetic word counted
    pieces_per_word_final: float | None
    domain_term_words: int
    pieces_per_domain_word_base: float | None
    pieces_per_domain_word_final: float | None


class NewToken(StageReport):
    """A mined domain word added to the vocabulary: its corpus frequency and the pieces the base vocabulary made."""

    token: str
    frequency: int
    base_pieces: int


class TokenizeReport(StageReport):
    """reports/tokenize.json."""

    mode: str  # tokenize.mode
    whole_word: bool
    language: str
    vocab_size: int
    base_vocab_size: int
    corpus: dict[str, Packed]  # train, validation
    task_text: Packed
    tokens: int  # corpus tokens, every split
    blocks: int
    shards: int
    unk_share: float  # share of the corpus tokens that are [UNK]
    fragmentation: Fragmentation
    new_tokens: int
    top_new_tokens: list[NewToken]
    tasks: dict[str, dict[str, Encoded]]  # task -> split -> encoded
    seconds: dict[str, float] | None = None  # measured: per phase
    pack_tokens_per_s: int | None = None  # measured
    pack_mb_per_s: float | None = None  # measured
    long_text: dict[str, str] | None = None  # tasks whose long texts are windows (finetune.tasks.<name>.long_text)
    warning: str | None = None  # the vocabulary leaves too much of the corpus as [UNK]: what to change
    engine: str | None = None  # tokenize.engine: ray only
    engine_cluster: dict[str, Any] | None = None  # the Ray cluster the shards were packed on
