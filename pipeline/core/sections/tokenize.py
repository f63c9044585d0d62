"""params.yaml ``tokenize``: vocabulary, segmentation and model-input lengths."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.sections.base import Strict


class ExtendVocab(Strict):
    """Mine whole domain words the base vocab splits into many pieces and add them as tokens."""

    enabled: bool
    max_new_tokens: int = Field(ge=0)
    min_frequency: int = Field(ge=1)
    min_pieces: int = Field(ge=2)


class ScratchVocab(Strict):
    """A WordPiece vocab trained from the corpus with ``tokenizers``' WordPieceTrainer."""

    vocab_size: int = Field(ge=10)
    min_frequency: int = Field(ge=1)
    lowercase: bool
    special_tokens: list[str] = Field(min_length=5)

    @model_validator(mode="after")
    def _bert_specials(self) -> ScratchVocab:
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in self.special_tokens]
        if missing:
            raise ValueError(f"special_tokens must contain the BERT special tokens, missing {missing}")
        return self


class TokenizeConfig(Strict):
    base_tokenizer: str = Field(min_length=1)
    mode: Literal["wordpiece", "wordpiece_scratch"]
    extend_vocab: ExtendVocab
    scratch: ScratchVocab
    whole_word: bool
    language: Literal["en", "zh"]
    jieba_user_dict: str | None
    max_seq_length: int = Field(ge=8)
    sentence_pairs: bool
    label_all_tokens: bool
    doc_stride: int = Field(ge=0)
    batch_docs: int = Field(ge=1)
    shard_docs: int = Field(ge=1)  # corpus documents per block shard (whole ingest row groups)
    engine: Literal["local", "ray"]  # local: shards one after another in this process; ray: Ray tasks on `ray`
    mining_max_docs: int = Field(ge=1)
    domain_terms: str | None

    @model_validator(mode="after")
    def _check(self) -> TokenizeConfig:
        if self.extend_vocab.enabled and self.mode != "wordpiece":
            raise ValueError("extend_vocab.enabled needs mode: wordpiece (a scratch vocab is already the corpus's own)")
        if self.doc_stride >= self.max_seq_length // 2:
            raise ValueError(
                f"doc_stride ({self.doc_stride}) must be below half of max_seq_length ({self.max_seq_length})"
            )
        return self
