"""Dropout with NumPy-drawn masks (pipeline.modelling.dropout): same distribution and gradients as PyTorch's,
reproducible under torch's seed, switched in for a training loop only."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.modelling.dropout import (
    CpuDropout,
    apply_dropout,
    cpu_dropout,
    eager_attention_cpu_dropout,
    keep_mask,
    register_attention,
    training_kernels,
)
from pipeline.modelling.precision import EAGER_CPU_DROPOUT, Precision


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_each_element_with_probability_one_minus_p(p: float) -> None:
    torch.manual_seed(0)
    mask = keep_mask((64, 128, 128), p)  # ~1M elements: the kept share is within 0.003 of 1 - p (6 sigma)
    assert mask.dtype == torch.bool and mask.shape == (64, 128, 128)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.003
    rows = mask.flatten(1).float().mean(1)  # no row is all kept or all dropped: the elements are independent
    assert rows.min() > 0 and rows.max() < 1


def test_keep_mask_follows_torch_seed() -> None:
    torch.manual_seed(3)
    first = keep_mask((100, 100), 0.1)
    torch.manual_seed(3)
    again = keep_mask((100, 100), 0.1)
    different = keep_mask((100, 100), 0.1)  # the next draw of the same stream
    assert torch.equal(first, again) and not torch.equal(first, different)


def test_apply_dropout_zeroes_or_scales_and_its_gradient_is_the_same_mask() -> None:
    torch.manual_seed(0)
    x = torch.randn(32, 50, requires_grad=True)
    y = apply_dropout(x, 0.2, training=True)
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / 0.8)
    assert 0.7 < kept.float().mean() < 0.9
    y.backward(torch.ones_like(y))
    assert torch.allclose(x.grad, kept.float() / 0.8)  # dropped elements get no gradient, kept ones the scale
    assert apply_dropout(x, 0.2, training=False) is x and apply_dropout(x, 0.0, training=True) is x
    assert torch.equal(apply_dropout(x, 1.0, training=True), torch.zeros_like(x))  # PyTorch's own for p = 1


def test_apply_dropout_keeps_the_dtype_of_bf16_activations() -> None:
    x = torch.randn(4, 8).to(torch.bfloat16)
    assert apply_dropout(x, 0.1, training=True).dtype == torch.bfloat16


def test_cpu_dropout_swaps_every_dropout_module_and_restores_it_also_on_error() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.3), torch.nn.Dropout(0.1, inplace=True))
    state = model.state_dict()
    with pytest.raises(RuntimeError, match="boom"), cpu_dropout(model):
        assert [type(m) for m in model[1:]] == [CpuDropout, CpuDropout]
        assert model[1].p == 0.3 and model.state_dict().keys() == state.keys()
        raise RuntimeError("boom")
    assert [type(m) for m in model[1:]] == [torch.nn.Dropout, torch.nn.Dropout]


def test_eager_attention_with_numpy_dropout_is_transformers_eager_attention_without_dropout() -> None:
    from transformers.models.bert.modeling_bert import eager_attention_forward

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.zeros(2, 1, 5, 5)
    mask[1, ..., 3:] = torch.finfo(torch.float32).min  # the second example's last two keys are padding
    module = torch.nn.Module().eval()
    ours = eager_attention_cpu_dropout(module, q, k, v, mask, dropout=0.1)
    theirs = eager_attention_forward(module, q, k, v, mask, dropout=0.1)
    assert torch.allclose(ours[0], theirs[0]) and torch.allclose(ours[1], theirs[1])
    module.train()
    _, probs = eager_attention_cpu_dropout(module, q, k, v, mask, dropout=0.5)
    assert ((probs == 0) | torch.isclose(probs, 2 * theirs[1])).all() and (probs == 0).any()


def test_training_kernels_on_a_cpu_train_the_same_model_and_leave_no_trace(tmp_path) -> None:
    from tests.model.test_precision import nested_tiny_mlm

    model, ids, mask = nested_tiny_mlm()
    with torch.no_grad():
        before = model["mlm"](input_ids=ids, attention_mask=mask).logits
    with training_kernels(model, Precision("fp32", "cpu", "test")):
        assert model["mlm"].bert.config._attn_implementation == EAGER_CPU_DROPOUT
        with torch.no_grad():
            inside = model["mlm"](input_ids=ids, attention_mask=mask).logits
        model["mlm"].save_pretrained(tmp_path)
        model.train()
        torch.manual_seed(1)
        loss = model["mlm"](input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()  # dropout active, gradients flow through the NumPy masks
    assert torch.allclose(before, inside, atol=1e-5)  # eval mode: the same attention, another kernel
    assert model["mlm"].config._attn_implementation == "sdpa"
    assert not any(isinstance(m, CpuDropout) for m in model.modules())
    assert not any("attn" in key for key in json.loads((tmp_path / "config.json").read_text()))
    assert model["mlm"].bert.embeddings.word_embeddings.weight.grad is not None


def test_training_kernels_on_a_gpu_leave_dropout_to_pytorch() -> None:
    from transformers import BertConfig, BertModel

    register_attention()
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2))
    model.set_attn_implementation("eager")
    with training_kernels(model, Precision("bf16", "cuda", "test")):  # the model stays on the CPU: nothing runs
        assert model.config._attn_implementation == "sdpa"
        assert not any(isinstance(m, CpuDropout) for m in model.modules())
    assert model.config._attn_implementation == "eager"
