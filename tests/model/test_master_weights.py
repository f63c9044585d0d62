"""bf16 weights with fp32 master weights (pipeline.training.master_weights): the update is fused AdamW's on the fp32
masters, the model holds them rounded to bf16, tied weights stay tied, and the model gets its fp32 masters back."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig

from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM
from pipeline.modelling.precision import Precision
from pipeline.training.master_weights import MasterAdamW, MasterWeights


def tiny_mlm() -> MaskedOnlyBertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,  # the same batch gives the same gradients, whatever the random state
        attention_probs_dropout_prob=0.0,
    )
    return MaskedOnlyBertForMaskedLM(config).train()


def batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 16), generator=generator)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if "bias" not in n]
    rest = [p for n, p in model.named_parameters() if "bias" in n]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-2, fused=True
    )


def test_the_update_is_fused_adamw_on_the_fp32_masters_and_the_model_holds_them_in_bf16() -> None:
    model = tiny_mlm()
    reference = copy.deepcopy(model)  # fp32, stepped by a plain fused AdamW with the same (bf16) gradients
    reference_opt = adamw(reference)
    weights = MasterWeights(model)
    opt = MasterAdamW(adamw(model), weights)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0] and opt.defaults["fused"]
    for _ in range(3):
        model(**batch()).loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters()}
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        opt.step()
        assert all(p.grad is None for p in model.parameters())
        for n, p in reference.named_parameters():
            p.grad = grads[n]
        reference_opt.step()
        reference_opt.zero_grad()
        for (n, p), (_, ref) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
            master = weights.of[id(p)]
            assert torch.equal(master, ref), n  # the masters are exactly what fp32 AdamW makes of these gradients
            assert torch.equal(p, ref.bfloat16()), n  # the model holds them rounded
    assert any(not torch.equal(m, m.bfloat16().float()) for m in weights.masters)  # the masters keep fp32 precision
    weights.release()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for p, ref in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, ref)


def test_tied_weights_have_one_master_and_stay_tied() -> None:
    model = tiny_mlm()
    embeddings, decoder = model.bert.embeddings.word_embeddings.weight, model.cls.predictions.decoder.weight
    assert embeddings is decoder
    weights = MasterWeights(model)
    assert len(weights.masters) == len(list(model.parameters()))
    opt = MasterAdamW(adamw(model), weights)
    model(**batch()).loss.backward()
    opt.step()
    assert model.bert.embeddings.word_embeddings.weight is model.cls.predictions.decoder.weight
    assert model.cls.predictions.decoder.weight.dtype == torch.bfloat16


def test_fp32_in_model_nests_and_gives_back_the_bf16_copies() -> None:
    model = tiny_mlm()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights = MasterWeights(model)
    with weights.fp32_in_model():
        with weights.fp32_in_model():
            state = model.state_dict()
        assert all(p.dtype == torch.float32 for p in model.parameters())  # the inner block did not end the outer
    assert all(torch.equal(state[n], t) for n, t in before.items())  # what a checkpoint saves: the fp32 masters
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_an_optimiser_state_saved_and_loaded_resumes_exactly() -> None:
    """What the Trainer does on resume: the model loads the checkpoint's fp32 masters, then the optimiser its state."""
    model = tiny_mlm()
    weights = MasterWeights(model)
    opt = MasterAdamW(adamw(model), weights)
    model(**batch()).loss.backward()
    opt.step()
    with weights.fp32_in_model():
        saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    model(**batch()).loss.backward()
    opt.step()
    expected = [m.clone() for m in weights.masters]

    resumed = tiny_mlm()
    resumed.load_state_dict(saved_model)
    resumed_weights = MasterWeights(resumed)
    resumed_opt = MasterAdamW(adamw(resumed), resumed_weights)
    resumed_opt.load_state_dict(saved_opt)
    resumed(**batch()).loss.backward()
    resumed_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(resumed_weights.masters, expected, strict=True))


def test_a_model_that_is_not_fp32_is_refused() -> None:
    with pytest.raises(ValueError, match="fp32 model"):
        MasterWeights(tiny_mlm().bfloat16())


@pytest.mark.parametrize(
    ("precision", "accumulation", "expected"),
    [
        (Precision("bf16", "cpu", ""), 1, True),
        (Precision("bf16", "cpu", ""), 4, False),  # four micro-batches' gradients would add up in bf16
        (Precision("bf16", "cuda", ""), 1, False),  # GPUs keep autocast
        (Precision("fp32", "cpu", ""), 1, False),
    ],
)
def test_bf16_weights_where_a_cpu_trains_in_bf16_one_micro_batch_a_step(
    precision: Precision, accumulation: int, expected: bool
) -> None:
    assert precision.bf16_weights(accumulation) is expected
