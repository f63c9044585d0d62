"""The vocabulary: domain words the base vocab fragments (mined, added as tokens) or a WordPiece vocab trained
from the corpus (HF ``tokenizers``), and how fragmented a vocab leaves domain terms."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import regex

from pipeline.core.errors import ConfigError, DataError
from pipeline.core.io import write_json
from pipeline.core.paths import Paths
from pipeline.text.corpus_shards import iter_corpus_batches
from pipeline.text.readers import decode_line

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.tokenize import ExtendVocab, ScratchVocab, TokenizeConfig


def raw_backend(tok: Any) -> Any:
    """A copy of the Rust tokenizer with padding and truncation off.

    Checkpoints often ship a ``tokenizer.json`` that pads and truncates to a fixed length
    (all-MiniLM-L6-v2 does, to 128): fine for sentence embeddings, wrong for packing a corpus.
    """
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return backend


# A BERT "word": a run of characters that are neither whitespace nor punctuation (Unicode P*
# or any ASCII non-alphanumeric), as in BertPreTokenizer. Needs `regex` for \p{P}.
_BERT_WORD = regex.compile(r"[^\s\p{P}\x21-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e]+")


def count_words(tok: Any, batches: Iterable[list[str]]) -> Counter[str]:
    """Word frequencies as the tokenizer sees words (its normaliser + pre-tokenizer).

    Counting raw BERT-word runs first (C regex + C counter, one call per batch) and passing
    only the distinct runs through the Rust normaliser/pre-tokenizer gives the same count for
    every word as pre-tokenizing every document, about four times faster (the pre-tokenizer
    still splits what the normaliser changes, e.g. CJK characters become one word each).
    Punctuation marks are not counted: every use here keeps alphabetic words only.
    """
    raw: Counter[str] = Counter()
    for texts in batches:
        raw.update(_BERT_WORD.findall("\n".join(texts)))
    backend = raw_backend(tok)
    counts: Counter[str] = Counter()
    for run, freq in raw.items():
        for word in words_of(backend, run):
            counts[word] += freq
    return counts


def words_of(backend: Any, text: str) -> list[str]:
    """``text``'s words as the Rust tokenizer ``backend`` sees them (normaliser, then pre-tokenizer)."""
    norm = backend.normalizer
    return [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(norm.normalize_str(text) if norm else text)]


def pieces_per_word(tok: Any, words: list[str]) -> list[int]:
    """How many tokens each (already normalised, pre-tokenized) word becomes, batch-encoded."""
    if not words:
        return []
    encodings = raw_backend(tok).encode_batch([[w] for w in words], is_pretokenized=True, add_special_tokens=False)
    return [len(e.ids) for e in encodings]


def mine_new_tokens(base: Any, counts: Counter[str], ext: ExtendVocab) -> list[dict[str, Any]]:
    """Frequent alphabetic words split into >= ``min_pieces`` pieces, ranked by frequency x pieces saved."""
    candidates = [w for w, f in counts.items() if f >= ext.min_frequency and w.isalpha()]
    pieces = pieces_per_word(base, candidates)
    scored = [(counts[w] * (p - 1), w, p) for w, p in zip(candidates, pieces, strict=True) if p >= ext.min_pieces]
    scored.sort(key=lambda x: (-x[0], x[1]))
    return [
        {"token": w, "frequency": counts[w], "base_pieces": p, "score": s} for s, w, p in scored[: ext.max_new_tokens]
    ]


def extend_tokenizer(base: Any, words: list[str], out_dir: Path) -> tuple[Any, dict[str, Any]]:
    """Append ``words`` to the base WordPiece vocab (as word-initial pieces) and save to ``out_dir``.

    Appending to the WordPiece model's vocab, rather than ``add_tokens``, keeps true WordPiece
    behaviour: ``kestxevirs`` becomes ``kestxevir ##s``, and the new ids follow the base ones, so
    pretrain resizes the embeddings and initialises row ``id`` from ``piece_ids``.
    """
    from transformers import AutoTokenizer

    base.save_pretrained(out_dir)
    spec_path = out_dir / "tokenizer.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    if spec["model"]["type"] != "WordPiece":
        raise ConfigError(f"tokenize.extend_vocab needs a WordPiece base tokenizer, got {spec['model']['type']}")
    vocab: dict[str, int] = spec["model"]["vocab"]
    new_tokens: dict[str, Any] = {}
    backend = raw_backend(base)
    for word in words:
        if word in vocab:
            continue
        piece_ids = backend.encode([word], is_pretokenized=True, add_special_tokens=False).ids
        vocab[word] = len(vocab)
        new_tokens[word] = {"id": vocab[word], "pieces": base.convert_ids_to_tokens(piece_ids), "piece_ids": piece_ids}
    spec_path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    write_json(out_dir / "new_tokens.json", new_tokens)
    return AutoTokenizer.from_pretrained(out_dir), new_tokens


def train_scratch(batches: Iterable[list[str]], sc: ScratchVocab, max_seq_length: int, out_dir: Path) -> Any:
    """Train a BERT-style WordPiece vocab with ``tokenizers.trainers.WordPieceTrainer``.

    (``train_new_from_iterator`` on a BERT tokenizer would train BPE merges, not WordPiece.)
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AutoTokenizer, BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=sc.lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=sc.vocab_size,
        min_frequency=sc.min_frequency,
        special_tokens=list(sc.special_tokens),
        continuing_subword_prefix="##",
    )
    tok.train_from_iterator((t for texts in batches for t in texts), trainer=trainer)
    size = tok.get_vocab_size()
    if size > sc.vocab_size:  # the trainer always keeps the alphabet and the special tokens
        raise ConfigError(
            f"tokenize.scratch.vocab_size={sc.vocab_size} is smaller than the {len(sc.special_tokens)} special tokens "
            f"plus the {size - len(sc.special_tokens)} characters of the corpus alphabet; set it to more than {size}"
        )
    wrapped = BertTokenizer(tokenizer_object=tok, model_max_length=max_seq_length, do_lower_case=sc.lowercase)
    wrapped.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def fragmentation(base: Any, tok: Any, counts: Counter[str], terms: list[str]) -> dict[str, Any]:
    """Mean pieces per word (frequency-weighted, alphabetic words) and per domain-term word."""
    words = [w for w in counts if w.isalpha()]
    freq = np.array([counts[w] for w in words], dtype=np.float64)
    out: dict[str, Any] = {"distinct_words": len(words)}
    for label, t in (("base", base), ("final", tok)):
        pieces = np.array(pieces_per_word(t, words), dtype=np.float64)
        out[f"pieces_per_word_{label}"] = round(float((pieces * freq).sum() / freq.sum()), 4) if len(words) else None
    backend = raw_backend(tok)
    term_words = sorted({w for term in terms for w in words_of(backend, term) if w.isalpha()})
    out["domain_term_words"] = len(term_words)
    for label, t in (("base", base), ("final", tok)):
        out[f"pieces_per_domain_word_{label}"] = (
            round(float(np.mean(pieces_per_word(t, term_words))), 4) if term_words else None
        )
    return out


def build_tokenizer(
    tc: TokenizeConfig, paths: Paths, base: Any, counts: Counter[str], out_dir: Path
) -> tuple[Any, list[dict[str, Any]]]:
    """The stage's tokenizer, saved in ``out_dir``: base, base + mined words, or trained from scratch."""
    if tc.mode == "wordpiece_scratch":
        return train_scratch(
            iter_corpus_batches(paths.corpus, "train", tc.batch_docs), tc.scratch, tc.max_seq_length, out_dir
        ), []
    if tc.extend_vocab.enabled:
        mined = mine_new_tokens(base, counts, tc.extend_vocab)
        tok, _ = extend_tokenizer(base, [m["token"] for m in mined], out_dir)
        return tok, mined
    base.save_pretrained(out_dir)
    return base, []


def read_terms(path: str | None, root: Path) -> list[str]:
    """The domain terms fragmentation is measured on (``tokenize.domain_terms``, one per line), if a file is set."""
    if not path:
        return []
    full = Path(path) if Path(path).is_absolute() else root / path
    if not full.is_file():
        raise DataError(
            path, None, "missing-path", "tokenize.domain_terms: file not found (set it to null to use the mined words)"
        )
    lines = full.read_bytes().split(b"\n")
    return [term for n, raw in enumerate(lines, start=1) if (term := decode_line(raw, full, n).strip())]
