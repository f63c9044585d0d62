"""Masked-only MLM head: the same loss and gradients as transformers' dense head, saved as a standard BERT."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertForPreTraining

from pipeline.modelling.masking import MaskingCollator, SentencePairCollator
from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM, MaskedOnlyBertForPreTraining
from pipeline.modelling.models import load_tokenizer
from tests.unit.test_masking import _blocks


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("minilm", "tokenize.base_tokenizer")


def _config(tok, **kwargs) -> BertConfig:
    # dropout off so the two models see identical activations; sdpa as in the stages
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        **kwargs,
    )
    config._attn_implementation = "sdpa"
    return config


def _pair(sparse_cls, dense_cls, config) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    dense = dense_cls(config)
    sparse = sparse_cls(config)
    sparse.load_state_dict(dense.state_dict())
    return sparse, dense


@pytest.mark.parametrize("masking", ["token", "whole_word", "span"])
def test_masked_only_loss_and_gradients_equal_the_dense_head(tok, masking: str) -> None:
    batch = MaskingCollator(tok, masking=masking, seed=3)(_blocks(tok, 8, 64))
    sparse, dense = _pair(MaskedOnlyBertForMaskedLM, BertForMaskedLM, _config(tok))
    out_sparse, out_dense = sparse(**batch), dense(**batch)
    n_masked = int((batch["labels"] != -100).sum())
    assert out_sparse.logits.shape == (n_masked, len(tok))  # the head ran at the masked positions only
    assert out_dense.logits.shape[:2] == batch["input_ids"].shape
    assert abs(out_sparse.loss.item() - out_dense.loss.item()) < 1e-5
    out_sparse.loss.backward()
    out_dense.loss.backward()
    grads = dict(dense.named_parameters())
    for name, param in sparse.named_parameters():
        assert torch.allclose(param.grad, grads[name].grad, atol=1e-6, rtol=1e-4), name


@pytest.mark.parametrize("objective", ["sop", "nsp"])
def test_sentence_objective_loss_equals_bert_for_pretraining(tok, objective: str) -> None:
    rng = np.random.default_rng(0)
    pairs = [
        {"a_ids": rng.integers(2000, 9000, 10).tolist(), "b_ids": rng.integers(9000, 20000, 12).tolist()}
        for _ in range(8)
    ]
    batch = SentencePairCollator(tok, objective, batch_seed=1)(pairs)
    sparse, dense = _pair(MaskedOnlyBertForPreTraining, BertForPreTraining, _config(tok))
    assert abs(sparse(**batch).loss.item() - dense(**batch).loss.item()) < 1e-5  # both weigh the sentence loss 1.0
    sparse.sentence_loss_weight = 0.5
    inputs = {k: v for k, v in batch.items() if k != "next_sentence_label"}
    mlm_only = sparse(**inputs).loss.item()
    sentence = torch.nn.functional.cross_entropy(
        dense(**batch).seq_relationship_logits, batch["next_sentence_label"]
    ).item()
    assert abs(sparse(**batch).loss.item() - (mlm_only + 0.5 * sentence)) < 1e-5


def test_dense_setting_gives_the_same_loss(tok) -> None:
    batch = MaskingCollator(tok, masking="token", seed=5)(_blocks(tok, 4, 32))
    sparse, dense = _pair(MaskedOnlyBertForMaskedLM, BertForMaskedLM, _config(tok))
    sparse.masked_only = False
    out = sparse(**batch)
    assert out.logits.shape[:2] == batch["input_ids"].shape
    assert abs(out.loss.item() - dense(**batch).loss.item()) < 1e-5


def test_a_batch_without_masked_positions_gives_zero_loss_not_nan(tok) -> None:
    batch = MaskingCollator(tok, masking="token", seed=5)(_blocks(tok, 2, 16))
    batch["labels"][:] = -100
    sparse, _ = _pair(MaskedOnlyBertForMaskedLM, BertForMaskedLM, _config(tok))
    loss = sparse(**batch).loss
    assert loss.item() == 0.0
    loss.backward()  # still part of the graph


def test_saved_model_is_a_standard_bert_for_masked_lm(tok, tmp_path: Path) -> None:
    from transformers import AutoModelForMaskedLM, pipeline

    sparse, _ = _pair(MaskedOnlyBertForMaskedLM, BertForMaskedLM, _config(tok))
    sparse.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert type(loaded) is BertForMaskedLM
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), sparse.state_dict().values(), strict=True)
    )
    filled = pipeline("fill-mask", model=str(tmp_path), tokenizer=str(tmp_path))(
        f"the patient received {tok.mask_token} daily."
    )
    assert len(filled) == 5 and all("token_str" in f for f in filled)
    # no labels: the parent forward, logits at every position (what fill-mask relies on)
    ids = tok("a short sentence", return_tensors="pt")
    assert sparse(**ids).logits.shape == (1, ids["input_ids"].shape[1], len(tok))


def test_saved_pretraining_model_names_bert_for_pretraining(tok, tmp_path: Path) -> None:
    sparse, _ = _pair(MaskedOnlyBertForPreTraining, BertForPreTraining, _config(tok))
    sparse.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert type(BertForPreTraining.from_pretrained(tmp_path)) is BertForPreTraining


def test_pretraining_dropout_is_set_on_the_modules_and_the_saved_config_keeps_the_base_value(
    tok, tmp_path: Path
) -> None:
    from pipeline.training.pretraining.model import set_dropout

    config = _config(tok)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.1
    model = MaskedOnlyBertForMaskedLM(config)
    set_dropout(model.bert, attention=0.0, hidden=None)
    drops = {n: m.p for n, m in model.bert.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert drops and all(p == (0.0 if n.endswith("attention.self.dropout") else 0.1) for n, p in drops.items())
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attention_probs_dropout_prob"] == 0.1 and saved["hidden_dropout_prob"] == 0.1
