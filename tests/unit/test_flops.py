"""The FLOPs we count from a model's shape are the ones PyTorch counts when it trains a step."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForMaskedLM

from pipeline.modelling.flops import mlm_train_flops_per_token
from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM

CONFIG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=101)


def counted_step_flops(model: torch.nn.Module, batch: int, seq_len: int, masked: int) -> int:
    """PyTorch's count of one forward and backward with ``masked`` positions per sequence labelled."""
    ids = torch.randint(5, 100, (batch, seq_len))
    labels = torch.full_like(ids, -100)
    labels[:, :masked] = ids[:, :masked]
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("seq_len", [8, 16])
def test_the_count_matches_pytorchs_for_the_masked_only_head(attention: str, seq_len: int) -> None:
    config = BertConfig(**CONFIG, attn_implementation=attention)
    model = MaskedOnlyBertForMaskedLM(config).train()
    expected = mlm_train_flops_per_token(config, seq_len, masked_share=4 / seq_len) * 3 * seq_len
    assert counted_step_flops(model, 3, seq_len, 4) == expected


def test_a_dense_head_does_more_work_than_the_model_needs() -> None:
    """The dense head computes every position: PyTorch's count is the formula with every position masked,
    more than the model FLOPs we credit (the head at the masked positions only)."""
    config = BertConfig(**CONFIG)
    dense = counted_step_flops(BertForMaskedLM(config).train(), 2, 16, 4)
    assert dense == mlm_train_flops_per_token(config, 16, masked_share=1.0) * 2 * 16
    assert dense > mlm_train_flops_per_token(config, 16, masked_share=4 / 16) * 2 * 16


def test_the_benchmarks_efficiency_is_model_flops_over_the_measured_peak_of_its_precision() -> None:
    from benchmarks.pretrain import add_efficiency, model_shapes

    config = BertConfig(**CONFIG)
    assert model_shapes(config, batch=2, seq_len=10) == [(20, 32, 32), (20, 32, 64), (20, 64, 32), (3, 32, 101)]
    rates = {"fp32 20x32 @ 32x64": 4e9, "fp32 3x32 @ 32x101": 8e9, "bf16 20x32 @ 32x64": 16e9}
    rows = [{"precision": "fp32", "tok_s": 100.0}, {"precision": "bf16", "tok_s": 100.0}]
    add_efficiency(rows, rates, flops_per_token=2e7, tokens_per_s="tok_s")  # 2 GFLOP/s achieved
    assert [(r["model_gflop_per_s"], r["peak_share"]) for r in rows] == [(2.0, 0.25), (2.0, 0.125)]


def test_the_electra_count_matches_pytorchs() -> None:
    """Generator and discriminator, forward and backward, as PyTorch counts them (the sampling is no matmul)."""
    from transformers import BertModel

    from pipeline.modelling.electra import ElectraPretraining
    from pipeline.modelling.flops import electra_train_flops_per_token

    config = BertConfig(**CONFIG)
    small = BertConfig(**{**CONFIG, "num_hidden_layers": 1})
    model = ElectraPretraining(BertModel(config, add_pooling_layer=False), MaskedOnlyBertForMaskedLM(small), 50.0)
    seq_len, masked = 16, 4
    expected = electra_train_flops_per_token(config, seq_len, 1, masked_share=masked / seq_len) * 3 * seq_len
    assert counted_step_flops(model.train(), 3, seq_len, masked) == expected
