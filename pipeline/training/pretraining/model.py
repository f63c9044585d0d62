"""The model pretraining trains: the offline MiniLM, a local BERT, a hub id or a scratch ``BertConfig`` with an MLM
head (a fresh one where the base ships none), ELECTRA's generator and discriminator, the new-token rows initialised
as the mean of their base pieces, dropout set per run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.core.console import note
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.modelling.models import check_bert, resolve_base, scratch_bert_config


def announce_new_weights(base_model: str, missing: list[str] | set[str]) -> None:
    """Say in one line which heads the base checkpoint lacks (initialised fresh), instead of transformers' load table."""
    heads = sorted({key.split(".")[0] for key in missing})
    if heads:
        what = {"cls": "MLM head"}.get(heads[0], heads[0]) if len(heads) == 1 else ", ".join(heads)
        note("pretrain", f"{base_model} ships no {what}: a new one is initialised ({len(missing)} tensors)")


def build_model(pc: PretrainConfig, tok: Any, tok_dir: Path, block_len: int) -> Any:
    """``BertForMaskedLM`` (``BertForPreTraining`` with a sentence objective) for ``pc.base_model``,
    its vocab matched to the tokenizer; with ``objective: electra`` the generator and discriminator pair."""
    from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM, MaskedOnlyBertForPreTraining

    if pc.objective == "electra":
        return build_electra(pc, tok, tok_dir, block_len)
    # standard BertForMaskedLM / BertForPreTraining (MLM + sentence head) weights, with the MLM head run at masked positions only
    model_cls = MaskedOnlyBertForMaskedLM if pc.sentence_objective == "none" else MaskedOnlyBertForPreTraining
    model = load_masked_lm(pc, model_cls, tok, tok_dir, block_len)
    model.sentence_loss_weight = pc.sentence_loss_weight
    set_dropout(model.bert, pc.attention_dropout, pc.hidden_dropout)
    return model


def build_electra(pc: PretrainConfig, tok: Any, tok_dir: Path, block_len: int) -> Any:
    """ELECTRA's pair (:mod:`pipeline.modelling.electra`): the discriminator is ``pc.base_model``'s encoder, the
    generator a masked LM of its first ``generator_fraction`` of layers (their weights from the base model, its MLM
    head the base model's where it ships one), the embeddings shared."""
    from pipeline.modelling.electra import ElectraPretraining, generator_layers
    from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM

    discriminator = load_masked_lm(pc, MaskedOnlyBertForMaskedLM, tok, tok_dir, block_len, announce=False).bert
    layers = generator_layers(discriminator.config.num_hidden_layers, pc.electra.generator_fraction)
    generator = load_masked_lm(pc, MaskedOnlyBertForMaskedLM, tok, tok_dir, block_len, layers=layers)
    model = ElectraPretraining(discriminator, generator, pc.electra.rtd_weight)
    for encoder in (model.bert, model.generator.bert):
        set_dropout(encoder, pc.attention_dropout, pc.hidden_dropout)
    note(
        "pretrain",
        f"ELECTRA: generator of {layers} of {discriminator.config.num_hidden_layers} layers (embeddings shared), "
        f"discriminator loss weight {pc.electra.rtd_weight:g}",
    )
    return model


def load_masked_lm(
    pc: PretrainConfig,
    model_cls: Any,
    tok: Any,
    tok_dir: Path,
    block_len: int,
    layers: int | None = None,
    announce: bool = True,
) -> Any:
    """``model_cls`` (a masked-only MLM class) from ``pc.base_model`` (or its scratch config), its first ``layers``
    encoder layers only where given, new-token rows initialised, its head set to ``pc.mlm_head``."""
    import torch

    depth = {} if layers is None else {"num_hidden_layers": layers}
    if pc.base_model == "scratch":
        s = pc.scratch
        config = scratch_bert_config(s, len(tok), tok.pad_token_id)
        for key, value in depth.items():
            setattr(config, key, value)
        config._attn_implementation = "sdpa"
        model = model_cls(config)
    else:
        source = resolve_base(pc.base_model, "pretrain.base_model")
        check_bert(source, "pretrain.base_model")
        model, loading = model_cls.from_pretrained(
            source,
            use_safetensors=True,
            attn_implementation="sdpa",
            dtype=torch.float32,
            output_loading_info=True,
            **depth,
        )
        if announce:
            announce_new_weights(pc.base_model, loading["missing_keys"])
    if block_len > model.config.max_position_embeddings:
        raise ConfigError(
            f"blocks of {block_len} tokens exceed the model's max_position_embeddings={model.config.max_position_embeddings}"
        )
    new_tokens_path = tok_dir / "new_tokens.json"
    # a model that already has the tokenizer's rows (one adapted with it, continued) keeps its trained new rows
    if new_tokens_path.exists() and pc.base_model != "scratch" and model.config.vocab_size != len(tok):
        init_new_token_rows(model, len(tok), json.loads(new_tokens_path.read_text(encoding="utf-8")))
    if model.config.vocab_size != len(tok):
        raise DataError(
            tok_dir,
            None,
            "vocab-mismatch",
            f"the tokenizer has {len(tok)} tokens but pretrain.base_model "
            f"'{pc.base_model}' has vocab_size={model.config.vocab_size}",
        )
    model.masked_only = pc.mlm_head == "masked_only"
    return model


def set_dropout(encoder: Any, attention: float | None, hidden: float | None) -> None:
    """Training dropout of the encoder's attention probabilities / hidden states (``None``: the base model's).

    Set on the modules, not the config: the saved model keeps the base model's dropout for fine-tuning.
    """
    from torch import nn

    for name, module in encoder.named_modules():
        if not isinstance(module, nn.Dropout):
            continue
        value = attention if name.endswith("attention.self.dropout") else hidden
        if value is not None:
            module.p = value


def init_new_token_rows(model: Any, vocab_size: int, new_tokens: dict[str, Any]) -> None:
    """Resize to ``vocab_size`` and set each new embedding row to the mean of its base pieces' rows.

    The MLM decoder stays tied to the input embeddings, so it gets the same rows; the decoder
    bias of a new token is the mean of its pieces' biases.
    """
    import torch

    old = model.get_input_embeddings().weight.shape[0]
    if (
        any(info["id"] < old for info in new_tokens.values())
        or max((i["id"] for i in new_tokens.values()), default=-1) >= vocab_size
    ):
        raise DataError(
            "new_tokens.json", None, "vocab-mismatch", f"new token ids do not follow the base vocab of {old} rows"
        )
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    emb = model.get_input_embeddings().weight
    bias = model.cls.predictions.decoder.bias if model.cls.predictions.decoder.bias is not None else None
    with torch.no_grad():
        for info in new_tokens.values():
            pieces = torch.tensor(info["piece_ids"])
            emb[info["id"]] = emb[pieces].mean(dim=0)
            if bias is not None:
                bias[info["id"]] = bias[pieces].mean()
    model.tie_weights()
