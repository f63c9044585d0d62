"""FGM / PGD on the word embeddings: the configured norm, exact restoration, clean + adversarial gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.training.adversarial import adversarial_backward, word_embeddings


def tiny_model() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=3
    )
    return BertForSequenceClassification(config).eval()  # no dropout: the same batch gives the same loss


BATCH = {"input_ids": torch.tensor([[2, 7, 9, 4], [3, 8, 1, 0]]), "labels": torch.tensor([0, 2])}


def clean_backward(model: torch.nn.Module) -> None:
    model.zero_grad()
    model(**BATCH).loss.backward()


def test_fgm_moves_the_embeddings_by_epsilon_then_restores_them_exactly() -> None:
    model = tiny_model()
    emb = word_embeddings(model)
    before = emb.data.clone()
    clean_backward(model)
    seen = []

    def loss_fn() -> torch.Tensor:
        seen.append(float(torch.linalg.vector_norm(emb.data - before)))
        return model(**BATCH).loss

    out = adversarial_backward(model, loss_fn, "fgm", epsilon=0.5)
    assert seen == [pytest.approx(0.5, rel=1e-4)] and out["delta_norm"] == pytest.approx(0.5, rel=1e-5)
    assert torch.equal(emb.data, before)


def test_fgm_adds_the_adversarial_gradient_to_the_clean_one() -> None:
    model = tiny_model()
    reference = copy.deepcopy(model)
    clean_backward(reference)
    clean = {n: p.grad.clone() for n, p in reference.named_parameters()}
    direction = word_embeddings(reference).grad / torch.linalg.vector_norm(word_embeddings(reference).grad)
    word_embeddings(reference).data.add_(0.3 * direction)
    reference.zero_grad()
    adv_loss = reference(**BATCH).loss
    adv_loss.backward()
    expected = {n: clean[n] + p.grad for n, p in reference.named_parameters()}

    clean_backward(model)
    out = adversarial_backward(model, lambda: model(**BATCH).loss, "fgm", epsilon=0.3)
    assert out["adv_loss"] == pytest.approx(float(adv_loss.detach()))
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7)


def test_the_perturbation_raises_the_loss() -> None:
    model = tiny_model()
    clean_backward(model)
    clean_loss = float(model(**BATCH).loss.detach())
    out = adversarial_backward(model, lambda: model(**BATCH).loss, "fgm", epsilon=1.0)
    assert out["adv_loss"] > clean_loss  # a step up the gradient


@pytest.mark.parametrize(("alpha", "steps"), [(0.2, 3), (1.0, 3), (None, 2)])
def test_pgd_stays_within_epsilon_and_restores_the_embeddings(alpha: float | None, steps: int) -> None:
    model = tiny_model()
    emb = word_embeddings(model)
    before = emb.data.clone()
    clean_backward(model)
    norms = []

    def loss_fn() -> torch.Tensor:
        norms.append(float(torch.linalg.vector_norm(emb.data - before)))
        return model(**BATCH).loss

    out = adversarial_backward(model, loss_fn, "pgd", epsilon=0.5, alpha=alpha, steps=steps)
    assert len(norms) == steps and all(n <= 0.5 * (1 + 1e-5) for n in norms)
    if alpha == 1.0:
        assert norms == [pytest.approx(0.5, rel=1e-4)] * steps  # every step leaves the ball: projected onto it
    assert out["delta_norm"] == pytest.approx(norms[-1], rel=1e-4)
    assert torch.equal(emb.data, before)


def test_the_embeddings_are_restored_when_the_adversarial_loss_fails() -> None:
    model = tiny_model()
    before = word_embeddings(model).data.clone()
    clean_backward(model)

    def failing() -> torch.Tensor:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        adversarial_backward(model, failing, "fgm", epsilon=0.5)
    assert torch.equal(word_embeddings(model).data, before)


def test_a_zero_gradient_perturbs_nothing() -> None:
    model = tiny_model()
    model.zero_grad()
    word_embeddings(model).grad = torch.zeros_like(word_embeddings(model))
    assert adversarial_backward(model, lambda: model(**BATCH).loss, "pgd", epsilon=0.5) == {
        "adv_loss": None,
        "delta_norm": 0.0,
    }


def test_it_works_under_bf16_autocast() -> None:
    model = tiny_model()
    before = word_embeddings(model).data.clone()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        clean_backward(model)
        out = adversarial_backward(model, lambda: model(**BATCH).loss, "fgm", epsilon=0.5)
    assert out["adv_loss"] is not None and torch.isfinite(torch.tensor(out["adv_loss"]))
    assert torch.equal(word_embeddings(model).data, before)


@pytest.mark.parametrize(("method", "epsilon", "message"), [("vat", 0.5, "fgm or pgd"), ("fgm", 0.0, "> 0")])
def test_bad_settings_are_refused(method: str, epsilon: float, message: str) -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match=message):
        adversarial_backward(model, lambda: model(**BATCH).loss, method, epsilon)


# ----------------------------------------------------------------------------- in the finetune stage


@pytest.mark.parametrize("method", ["fgm", "pgd"])
def test_finetune_with_adversarial_training_logs_it_and_resumes_exactly(pretrained, tmp_path, method: str) -> None:
    """Train 20 steps with FGM/PGD; a second run that lost checkpoint-20 resumes from checkpoint-10 and ends on
    bit-identical weights. The same run without the perturbation ends elsewhere (so it was applied)."""
    import json
    import shutil

    from safetensors.torch import load_file

    from pipeline.stages import finetune
    from tests.conftest import TINY_FINETUNE, TINY_PRETRAIN, copy_project, make_config

    _, src = pretrained
    settings = {
        **TINY_PRETRAIN,
        **TINY_FINETUNE,
        "finetune.baseline": False,
        "finetune.max_steps": 20,
        "finetune.early_stopping_patience": 5,
        "finetune.adversarial": method,
        "finetune.adversarial_epsilon": 0.5,
        "finetune.adversarial_steps": 2,
    }
    first = copy_project(src, tmp_path / "first")
    finetune.run(make_config(**settings), first)
    ckpts = first.finetune_checkpoints / "adapted"
    state = json.loads((ckpts / "checkpoint-20" / "trainer_state.json").read_text())
    adv = [e["adv_loss"] for e in state["log_history"] if "adv_loss" in e]
    assert len(adv) == 4 and all(x > 0 for x in adv)  # every logging step (5) reports the adversarial loss

    second = copy_project(first, tmp_path / "second")
    shutil.rmtree(second.finetune_checkpoints / "adapted" / "checkpoint-20")
    again = finetune.run(make_config(**settings), second).adapted
    assert again.resumed_from == "checkpoint-10"
    a = load_file(ckpts / "checkpoint-20" / "model.safetensors")
    b = load_file(second.finetune_checkpoints / "adapted" / "checkpoint-20" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    plain = copy_project(src, tmp_path / "plain")
    finetune.run(make_config(**{**settings, "finetune.adversarial": "none"}), plain)
    c = load_file(plain.finetune_checkpoints / "adapted" / "checkpoint-20" / "model.safetensors")
    assert any(not torch.equal(a[k], c[k]) for k in a)
