"""pretrain.objective: electra: replaced-token labels, the loss by hand, the saved encoder, exact resume after kill -9."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F

from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.electra import (
    GENERATOR_DIR,
    HEAD_FILE,
    ElectraPretraining,
    RtdCollator,
    corrupt,
    generator_layers,
    sample_replacements,
    unique_state_dict,
)
from pipeline.modelling.labels import IGNORE_INDEX
from pipeline.modelling.shards import open_group
from pipeline.stages import finetune, pretrain
from tests.conftest import TINY_FINETUNE, TINY_PRETRAIN, make_config, write_params
from tests.model.test_pretrain import _cli

ELECTRA = {**TINY_PRETRAIN, "pretrain.objective": "electra", "pretrain.electra.generator_fraction": 0.5}


def tiny_pair(vocab: int = 50, rtd_weight: float = 50.0) -> ElectraPretraining:
    """A 2-layer discriminator and 1-layer generator of width 16, seeded."""
    from transformers import BertConfig, BertModel

    from pipeline.modelling.mlm import MaskedOnlyBertForMaskedLM

    torch.manual_seed(0)

    def config(layers: int) -> BertConfig:
        return BertConfig(
            vocab_size=vocab,
            hidden_size=16,
            num_hidden_layers=layers,
            num_attention_heads=2,
            intermediate_size=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )

    return ElectraPretraining(
        BertModel(config(2), add_pooling_layer=False), MaskedOnlyBertForMaskedLM(config(1)), rtd_weight
    )


def test_generator_layers_are_a_share_of_the_discriminators() -> None:
    assert generator_layers(6, 0.333) == 2  # MiniLM
    assert generator_layers(12, 0.25) == 3  # bert-base at the paper's 1/4
    assert generator_layers(2, 0.1) == 1 and generator_layers(4, 1.0) == 4


def test_labels_mark_exactly_the_replaced_positions_and_never_a_sample_equal_to_the_original() -> None:
    input_ids = torch.tensor([[1, 103, 5, 103, 7, 0], [1, 9, 103, 4, 2, 0]])
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[0, 1], labels[0, 3], labels[1, 2], labels[1, 4] = 11, 12, 13, 2  # (1, 4): selected but left unchanged
    sampled = torch.tensor([11, 40, 41, 2])  # first equals its original, last too; the middle two differ
    original, corrupted, replaced = corrupt(input_ids, labels, sampled)
    assert original.tolist() == [[1, 11, 5, 12, 7, 0], [1, 9, 13, 4, 2, 0]]
    assert corrupted.tolist() == [[1, 11, 5, 40, 7, 0], [1, 9, 41, 4, 2, 0]]
    assert replaced.tolist() == [[False, False, False, True, False, False], [False, False, True, False, False, False]]
    assert torch.equal(replaced, corrupted != original)  # labelled replaced <=> differs from the original


def test_samples_of_a_forward_pass_and_their_labels_agree() -> None:
    model = tiny_pair()
    input_ids = torch.randint(5, 50, (4, 12))
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    chosen = torch.rand(input_ids.shape) < 0.5
    labels[chosen] = input_ids[chosen]
    input_ids[chosen] = 3  # [MASK]
    out = model(input_ids=input_ids, labels=labels, sampler=torch.Generator().manual_seed(1))
    original = torch.where(chosen, labels, input_ids)
    assert torch.equal(out.corrupted_ids[~chosen], original[~chosen])  # only chosen positions change
    assert torch.equal(out.replaced, out.corrupted_ids != original)
    assert not out.replaced[~chosen].any()
    assert (out.corrupted_ids[out.replaced] != original[out.replaced]).all()
    assert out.replaced.any()  # an untrained generator replaces most chosen tokens


def _first_above(probs: list[float], uniform: float) -> int:
    """Inverse transform sampling by hand: the first index whose running sum exceeds ``uniform`` x the total."""
    target, running = uniform * sum(probs), 0.0
    for index, p in enumerate(probs):
        running += p
        if running > target:
            return index
    return len(probs) - 1


def test_replacements_follow_the_generator_s_distribution_and_skip_impossible_tokens() -> None:
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.0, 0.4])
    logits = torch.log(probs).expand(200_000, -1)  # -inf where a token is impossible
    sampled = sample_replacements(logits, torch.Generator().manual_seed(0))
    share = torch.bincount(sampled, minlength=6).double() / len(sampled)
    assert share[1] == 0 and share[4] == 0
    torch.testing.assert_close(share, probs.double(), atol=0.005, rtol=0)  # ~4.5 standard errors at n = 200k
    assert torch.equal(sample_replacements(logits, torch.Generator().manual_seed(0)), sampled)  # seeded
    # a diverged generator (NaN logits) still yields token ids: the NaN loss then stops the run with the non-finite
    # loss guard's message (was: torch.multinomial's RuntimeError, reported as "a bug in adaptbert")
    diverged = sample_replacements(torch.full((3, 6), float("nan")), None)
    assert diverged.shape == (3,) and ((diverged >= 0) & (diverged < 6)).all()


def test_loss_equals_a_hand_computation_on_a_tiny_batch() -> None:
    model = tiny_pair(rtd_weight=50.0)
    input_ids = torch.tensor([[2, 3, 7, 3, 9, 4], [2, 8, 3, 6, 4, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[0, 1], labels[0, 3], labels[1, 2] = 17, 23, 31
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, labels=labels, sampler=torch.Generator().manual_seed(5)
    )
    # by hand: the generator's cross-entropy at the three masked positions ...
    gen = model.generator
    hidden = gen.bert(input_ids, attention_mask=attention_mask).last_hidden_state
    logits = gen.cls(hidden)  # every position, transformers' own head
    keep = labels != IGNORE_INDEX
    gen_loss = F.cross_entropy(logits[keep], labels[keep])
    # ... the same samples (same seed, same distribution: one uniform per masked position, the first token whose
    # cumulative probability exceeds it) ...
    probs = torch.softmax(logits[keep], dim=-1)
    uniforms = torch.rand(len(probs), 1, generator=torch.Generator().manual_seed(5)).squeeze(-1).tolist()
    sampled = torch.tensor([_first_above(row.tolist(), u) for row, u in zip(probs, uniforms, strict=True)])
    original = torch.where(keep, labels, input_ids)
    corrupted = original.clone()
    corrupted[keep] = sampled
    assert torch.equal(corrupted, out.corrupted_ids)
    # ... and the discriminator's mean binary cross-entropy over the 11 real tokens, weighted 50
    disc_hidden = model.bert(corrupted, attention_mask=attention_mask).last_hidden_state
    head = model.discriminator_head
    disc_logits = head.out(F.gelu(head.dense(disc_hidden))).squeeze(-1)
    target = (corrupted != original).float()
    terms = []
    for i in range(2):
        for j in range(6):
            if attention_mask[i, j]:
                p = torch.sigmoid(disc_logits[i, j])
                terms.append(-(target[i, j] * torch.log(p) + (1 - target[i, j]) * torch.log(1 - p)))
    disc_loss = torch.stack(terms).mean()
    assert len(terms) == 11
    torch.testing.assert_close(out.generator_loss, gen_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.discriminator_loss, disc_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, gen_loss + 50.0 * disc_loss, atol=1e-4, rtol=1e-5)


def test_embeddings_are_shared_and_stored_once() -> None:
    model = tiny_pair()
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.generator.bert.embeddings.word_embeddings.weight is emb
    assert model.generator.cls.predictions.decoder.weight is emb
    unique = unique_state_dict(model)
    assert "bert.embeddings.word_embeddings.weight" in unique
    assert not any(k.startswith("generator.bert.embeddings.") for k in unique)
    assert "generator.cls.predictions.decoder.weight" not in unique
    # the sampling of replacements does not train the generator through the discriminator's loss
    out = model(
        input_ids=torch.tensor([[2, 3, 5, 4]]),
        labels=torch.tensor([[IGNORE_INDEX, 9, IGNORE_INDEX, IGNORE_INDEX]]),
        sampler=torch.Generator().manual_seed(0),
    )
    out.discriminator_loss.backward()
    assert model.generator.bert.encoder.layer[0].attention.self.query.weight.grad is None


def test_the_collator_adds_a_sample_seed_from_the_batchs_own_generator(ready: Paths) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ready.tokenizer)
    blocks, _ = open_group(ready.pretrain_blocks, "train")
    rows = [blocks[i] for i in range(4)]
    first = RtdCollator(tok, masking="whole_word", batch_seed=7)(rows)
    again = RtdCollator(tok, masking="whole_word", batch_seed=7)(rows)
    assert first["sample_seed"].shape == (1,) and torch.equal(first["sample_seed"], again["sample_seed"])
    from pipeline.modelling.masking import MaskingCollator

    mlm = MaskingCollator(tok, masking="whole_word", batch_seed=7)(rows)
    assert torch.equal(mlm["labels"], first["labels"])  # the masks are those of MLM training


def test_electra_pretrains_saves_a_standard_bert_and_fine_tunes(ready: Paths) -> None:
    from transformers import AutoModel, AutoModelForMaskedLM

    cfg = make_config(**ELECTRA, **TINY_FINETUNE)
    report = pretrain.run(cfg, ready)
    assert report.objective == "electra" and report.global_step == 6
    e = report.electra
    assert e is not None and e.generator_layers == 1 and e.model_extra == {**cfg.pretrain.electra.model_dump()}
    for side in (e.base, e.adapted):
        assert 0.0 <= side.accuracy <= 1.0 and 0.0 < side.replaced_share <= 0.15
    config = json.loads((ready.dapt / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["num_hidden_layers"] == 2
    encoder = AutoModel.from_pretrained(ready.dapt)
    saved = load_file(ready.dapt / "model.safetensors")
    assert not any("generator" in k or "discriminator" in k for k in saved)
    assert (ready.dapt / HEAD_FILE).exists()
    generator = AutoModelForMaskedLM.from_pretrained(ready.dapt / GENERATOR_DIR)
    assert generator.config.num_hidden_layers == 1
    # the generator's embeddings were the discriminator's
    torch.testing.assert_close(
        generator.bert.embeddings.word_embeddings.weight, encoder.embeddings.word_embeddings.weight
    )
    eval_csv = (ready.pretrain_curves / "eval.csv").read_text().splitlines()
    assert eval_csv[0] == "step,eval_loss,eval_perplexity,eval_rtd_accuracy,eval_rtd_auc" and len(eval_csv) == 3
    # register logs the generator as the fill-mask model (the encoder has no MLM head); it fills a [MASK]
    from transformers import pipeline as hf_pipeline

    from pipeline.serving.packaging import fill_mask_source

    assert fill_mask_source(ready) == ready.dapt / GENERATOR_DIR
    fill = hf_pipeline("fill-mask", model=str(fill_mask_source(ready)), tokenizer=str(ready.dapt))
    assert len(fill("the patient was given [MASK] .", top_k=3)) == 3
    ft = finetune.run(cfg, ready)  # fine-tuning loads the saved encoder unchanged
    assert ft.adapted.steps == 30 and (ft.adapted.best_dev_mean_primary or 0) > 0
    assert "ELECTRA" in (ready.dapt / "README.md").read_text()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_from_an_older_checkpoint_is_exact(ready: Paths, precision: str) -> None:
    """In-process: the newest checkpoint damaged, the stage resumes from the one before and ends on the
    uninterrupted run's weights, in fp32 and (where the hardware has it) bf16 autocast."""
    from pipeline.modelling.precision import resolve_precision

    if precision == "bf16" and not resolve_precision("auto").bf16:
        pytest.skip("this machine has no hardware bf16")
    cfg = make_config(**ELECTRA, precision=precision)
    first = pretrain.run(cfg, ready)
    assert first.global_step == 6 and first.precision == precision
    uninterrupted = load_file(ready.dapt / "model.safetensors")
    weights = ready.pretrain_checkpoints / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    second = pretrain.run(cfg, ready)
    assert second.resumed_from == "checkpoint-3" and second.global_step == 6
    resumed = load_file(ready.dapt / "model.safetensors")
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


@pytest.mark.slow
def test_kill_9_then_resume_is_bit_exact(ready: Paths, tmp_path: Path) -> None:
    """A run killed after a checkpoint and resumed ends with the weights of the uninterrupted run, bit for bit."""
    settings = {**ELECTRA, "pretrain.max_steps": 12, "pretrain.save_steps": 2, "pretrain.eval_steps": 6}
    params = write_params(tmp_path / "params.yaml", **settings)
    done = _cli(params, ready.root)
    _out, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]
    uninterrupted = load_file(ready.dapt / "model.safetensors")
    head = load_file(ready.dapt / HEAD_FILE)
    import shutil

    shutil.rmtree(ready.pretrain_checkpoints)
    shutil.rmtree(ready.dapt)
    proc = _cli(params, ready.root)
    deadline = time.monotonic() + 300
    while not (ready.pretrain_checkpoints / "checkpoint-6").exists():  # checkpoint-4 is complete then
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not ready.dapt.exists()
    again = _cli(params, ready.root)
    _out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    report = read_report(
        ready.pretrain_report, PretrainReport
    )  # with its run-to-run half (reports/measured/), where resumed_from is
    assert report.resumed_from is not None and report.global_step == 12, report.checkpoint_log
    resumed = load_file(ready.dapt / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for key in uninterrupted:
        assert torch.equal(resumed[key], uninterrupted[key]), key
    resumed_head = load_file(ready.dapt / HEAD_FILE)
    assert all(torch.equal(resumed_head[k], head[k]) for k in head)


@pytest.mark.slow
def test_two_processes_with_gloo(ready: Paths, tmp_path: Path) -> None:
    """torchrun: the pair trains under DDP (shared embeddings included) and rank 0 saves a standard encoder."""
    from transformers import AutoModel

    params = write_params(tmp_path / "params.yaml", **{**ELECTRA, "pretrain.nproc": 2, "pretrain.max_steps": 4})
    proc = _cli(params, ready.root)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    report = read_report(ready.pretrain_report, PretrainReport)
    assert report.world_size == 2 and report.global_step == 4 and report.objective == "electra"
    AutoModel.from_pretrained(ready.dapt)
    assert (ready.dapt / GENERATOR_DIR / "model.safetensors").exists()
