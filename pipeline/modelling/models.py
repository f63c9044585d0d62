"""Where base models and tokenizers come from; nothing here downloads unless a user names a hub id."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.core.base_model import MINILM, minilm_dir
from pipeline.core.errors import DataError
from pipeline.core.io import damaged_input


def resolve_base(name: str, key: str) -> str:
    """A local directory for ``name``: ``minilm``, an existing directory, or a hub id (online only).

    ``key`` is the params key that named it, for the error message.
    """
    if name == MINILM:
        return minilm_dir()
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


def check_model_dir(source: str | Path, key: str) -> None:
    """A local model directory holds a readable ``config.json`` with a ``model_type``, or this raises a
    ``[corrupt-model]`` naming the file and what rewrites it (transformers fails with an unrelated message: "Unrecognized
    model ... should have a model_type key"). :func:`check_weights` checks the weights. A hub id is left to transformers.
    """
    folder = Path(source)
    if not folder.is_dir():
        return
    config = folder / "config.json"
    if not config.is_file():
        raise damaged_input(config, "corrupt-model", f"{key}: the model directory {folder} has no config.json")
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, UnicodeDecodeError, AttributeError) as err:  # truncated, garbled, or not an object
        raise damaged_input(config, "corrupt-model", f"{key}: not a complete JSON object ({str(err)[:120]})") from None
    if not model_type:
        raise damaged_input(config, "corrupt-model", f"{key}: no model_type in it (is this a model's config?)")


def check_weights(source: str | Path, key: str) -> None:
    """A local model directory holds complete safetensors weights (their headers are read, not the tensors), or this
    raises a ``[corrupt-model]`` naming the file; a hub id is left to transformers."""
    from safetensors import SafetensorError, safe_open

    folder = Path(source)
    if not folder.is_dir():
        return
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise damaged_input(folder / "model.safetensors", "corrupt-model", f"{key}: no safetensors weights in {folder}")
    for path in weights:
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except SafetensorError as err:  # a truncated or garbled file (an unreadable one is an OSError: environment)
            raise damaged_input(
                path, "corrupt-model", f"{key}: truncated or corrupt weights ({str(err)[:160]})"
            ) from None


def check_bert(source: str | Path, key: str) -> None:
    """``source`` (a directory or hub id) holds a BERT with intact files, or this raises the ``DataError`` naming
    what is wrong: a damaged directory (:func:`check_model_dir`, :func:`check_weights`) or another architecture
    (``[not-a-bert]``); ``key`` says where it was named (a params key, or what it is)."""
    from transformers import AutoConfig

    check_model_dir(source, key)
    model_type = AutoConfig.from_pretrained(source).model_type  # never trust_remote_code
    if model_type != "bert":
        raise DataError(
            source,
            None,
            "not-a-bert",
            f"{key}: '{source}' is a '{model_type}' checkpoint, not a BERT (model_type 'bert')",
        )
    check_weights(source, key)


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
