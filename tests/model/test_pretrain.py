"""pretrain: model building, new-token rows, training, exact resume, corrupt checkpoints, NaN, DDP (kill -9 over
sharded blocks: tests/data/test_shards.py)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.core.errors import DataError, NonFiniteLoss
from pipeline.core.io import read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.core.reports.tokenize import TokenizeReport
from pipeline.modelling.models import resolve_base
from pipeline.modelling.shards import open_group
from pipeline.stages import pretrain, tokenize, validate
from pipeline.training.checkpoints import restore_weights
from pipeline.training.pretraining import budget
from pipeline.training.pretraining import model as pretrain_model
from pipeline.training.pretraining import run as pretrain_run
from tests.conftest import ROOT, TINY_PRETRAIN, make_config, small_disk, write_params


def test_new_token_rows_are_the_mean_of_their_pieces(ready: Paths) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ready.tokenizer)
    cfg = make_config()
    model = pretrain_model.build_model(cfg.pretrain, tok, ready.tokenizer, 128)
    from transformers import BertForMaskedLM

    base = BertForMaskedLM.from_pretrained(resolve_base("minilm", "x"))
    new = json.loads((ready.tokenizer / "new_tokens.json").read_text())
    emb = model.get_input_embeddings().weight
    base_emb = base.get_input_embeddings().weight
    assert emb.shape[0] == len(tok) == base_emb.shape[0] + len(new)
    for info in new.values():
        assert torch.allclose(emb[info["id"]], base_emb[info["piece_ids"]].mean(0), atol=1e-6)
    assert torch.equal(emb[:100], base_emb[:100])  # old rows untouched
    assert model.cls.predictions.decoder.weight.data_ptr() == emb.data_ptr()  # decoder still tied


def test_vocab_mismatch_and_non_bert_fail(ready: Paths, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ready.tokenizer)
    (ready.tokenizer / "new_tokens.json").unlink()  # the extended tokenizer no longer explains its size
    with pytest.raises(
        DataError, match=rf"tokenizer has {len(tok)} tokens but pretrain.base_model 'minilm' has vocab_size=30522"
    ):
        pretrain_model.build_model(make_config().pretrain, tok, ready.tokenizer, 128)
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    cfg = make_config(**{"pretrain.base_model": str(gpt)})
    with pytest.raises(DataError, match=r"is a 'gpt2' checkpoint, not a BERT"):
        pretrain_model.build_model(cfg.pretrain, tok, ready.tokenizer, 128)


def _curves(paths: Paths) -> list[dict]:
    with open(paths.pretrain_curves / "train.csv") as f:
        return list(csv.DictReader(f))


def test_loss_goes_down_and_perplexity_drops(ready: Paths) -> None:
    cfg = make_config(
        **{
            **TINY_PRETRAIN,
            "pretrain.max_steps": 30,
            "pretrain.eval_steps": 15,
            "pretrain.save_steps": 15,
            "pretrain.learning_rate": 1e-2,
            "pretrain.micro_batch_size": 8,
        }
    )
    report = pretrain.run(cfg, ready)
    losses = [float(r["loss"]) for r in _curves(ready)]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert report.adapted_perplexity < report.base_perplexity / 2
    assert report.global_step == 30 and report.tokens_seen > 0
    assert (ready.dapt / "model.safetensors").exists() and (ready.dapt / "README.md").exists()
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    AutoModelForMaskedLM.from_pretrained(ready.dapt)
    assert len(AutoTokenizer.from_pretrained(ready.dapt)) == len(AutoTokenizer.from_pretrained(ready.tokenizer))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_continues_exactly_and_skips_a_corrupt_checkpoint(ready: Paths, precision: str) -> None:
    """Bit-identical weights to the uninterrupted run, in fp32 and in bf16 (on a CPU the model trains in bf16 with
    fp32 master weights, and its checkpoints and saved model hold the fp32 masters)."""
    from pipeline.modelling.precision import resolve_precision

    if precision == "bf16" and not resolve_precision("auto").bf16:
        pytest.skip("this machine has no hardware bf16")
    cfg = make_config(**TINY_PRETRAIN, precision=precision)
    first = pretrain.run(cfg, ready)
    assert first.global_step == 6 and first.resumed_from is None and first.precision == precision
    assert first.training_weights == ("bf16, fp32 masters" if precision == "bf16" else "fp32")
    uninterrupted = load_file(ready.dapt / "model.safetensors")
    checkpointed = load_file(ready.pretrain_checkpoints / "checkpoint-6" / "model.safetensors")
    for weights in (uninterrupted, checkpointed):
        assert {t.dtype for t in weights.values()} == {torch.float32}
    assert any(not torch.equal(t, t.bfloat16().float()) for t in uninterrupted.values())  # not bf16 rounded
    assert all(torch.equal(checkpointed[k], uninterrupted[k]) for k in uninterrupted)  # the final step's masters
    # the newest checkpoint (step 6) is damaged: the stage must fall back to step 3 and go on from there
    weights = ready.pretrain_checkpoints / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    second = pretrain.run(cfg, ready)
    assert second.resumed_from == "checkpoint-3"
    assert any("checkpoint-6 is unusable" in line for line in second.checkpoint_log)
    assert (ready.pretrain_checkpoints / "checkpoint-6.corrupt").exists()
    state = json.loads((ready.pretrain_checkpoints / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6 == second.global_step
    resumed = load_file(ready.dapt / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for k in uninterrupted:
        assert torch.equal(resumed[k], uninterrupted[k]), k
    # died after the last checkpoint but before models/dapt was written: no extra step is trained
    import shutil

    shutil.rmtree(ready.dapt)
    third = pretrain.run(cfg, ready)
    assert third.resumed_from == "checkpoint-6" and third.global_step == 6
    final = load_file(ready.dapt / "model.safetensors")
    assert all(torch.equal(final[k], uninterrupted[k]) for k in uninterrupted)


class _Loud:
    """A pickled object that runs code when loaded (``torch.load(weights_only=False)`` would call it)."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("unpickled",))


def _drop_layer_1(ckpt: Path) -> None:
    weights = load_file(ckpt / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".layer.1." not in k}, str(ckpt / "model.safetensors"))


def _bf16_masters(ckpt: Path) -> None:
    weights = load_file(ckpt / "model.safetensors")
    save_file({k: v.bfloat16() for k, v in weights.items()}, str(ckpt / "model.safetensors"))


def _cut_rng_state(ckpt: Path) -> None:
    rng = ckpt / "rng_state.pth"
    rng.write_bytes(rng.read_bytes()[:200])


def _pickled_rng_state(ckpt: Path) -> None:
    torch.save({"cpu": _Loud()}, ckpt / "rng_state.pth")


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (_drop_layer_1, "model.safetensors: 16 of the model's tensors missing"),
        (_bf16_masters, "model.safetensors: bert.embeddings"),
        (_cut_rng_state, "rng_state.pth: "),
        (_pickled_rng_state, "rng_state.pth: UnpicklingError"),
    ],
    ids=["a layer removed", "bf16 masters", "rng state cut", "rng state pickled"],
)
def test_a_checkpoint_that_is_not_the_models_is_set_aside(ready: Paths, damage: Any, named: str) -> None:
    """Issue 61 (2): the Trainer loads weights non-strictly, so a valid file without layer 1 resumed with that layer
    freshly initialised (exit 0, no warning), and a damaged ``rng_state.pth`` was an internal error: each is now
    set aside as ``*.corrupt`` and the run resumes from the previous checkpoint, bit-exact."""
    cfg = make_config(**TINY_PRETRAIN, precision="fp32")
    pretrain.run(cfg, ready)
    uninterrupted = load_file(ready.dapt / "model.safetensors")
    damage(ready.pretrain_checkpoints / "checkpoint-6")
    second = pretrain.run(cfg, ready)
    assert second.resumed_from == "checkpoint-3", second.checkpoint_log
    assert len(second.checkpoint_log) == 1 and named in second.checkpoint_log[0], second.checkpoint_log
    assert (ready.pretrain_checkpoints / "checkpoint-6.corrupt").is_dir()
    resumed = load_file(ready.dapt / "model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def test_restoring_weights_that_do_not_fit_names_the_checkpoint(ready: Paths) -> None:
    """A run that had finished restores its last (or best) checkpoint without training: weights without a layer are
    ``[corrupt-checkpoint]`` naming the file (they were loaded non-strictly into the saved model)."""
    from transformers import AutoTokenizer

    cfg = make_config(**TINY_PRETRAIN, precision="fp32")
    pretrain.run(cfg, ready)
    ckpt = ready.pretrain_checkpoints / "checkpoint-6"
    model = pretrain_model.build_model(
        cfg.pretrain, AutoTokenizer.from_pretrained(ready.tokenizer), ready.tokenizer, 128
    )
    restore_weights(model, ckpt)  # intact: loads, the decoder still tied to the embeddings
    assert model.cls.predictions.decoder.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    _drop_layer_1(ckpt)
    with pytest.raises(DataError, match=r"checkpoint-6/model.safetensors: \[corrupt-checkpoint\] 16 of the model's"):
        restore_weights(model, ckpt)


def test_changed_params_do_not_resume_old_checkpoints(ready: Paths) -> None:
    pretrain.run(make_config(**TINY_PRETRAIN), ready)
    report = pretrain.run(make_config(**{**TINY_PRETRAIN, "pretrain.learning_rate": 5e-4}), ready)
    assert report.resumed_from is None
    assert any("moved them to" in line for line in report.checkpoint_log)


def test_nan_loss_stops_without_writing_a_checkpoint(ready: Paths, monkeypatch) -> None:
    build = pretrain_run.build_model

    def poisoned(*args, **kwargs):
        model = build(*args, **kwargs)
        with torch.no_grad():
            model.bert.embeddings.LayerNorm.weight.fill_(float("nan"))
        return model

    monkeypatch.setattr(pretrain_run, "build_model", poisoned)
    with pytest.raises(NonFiniteLoss, match="non-finite training loss nan at step 1"):
        pretrain.run(make_config(**TINY_PRETRAIN), ready)
    assert not list(ready.pretrain_checkpoints.glob("checkpoint-*"))
    assert not ready.dapt.exists()


def test_a_full_disk_under_checkpoints_exits_4_naming_the_folder(ready: Paths, tmp_path: Path) -> None:
    """Was: "[disk full] ... (the library that failed did not name the file)": the Trainer's checkpoint writers
    (safetensors, ``torch.save``) give no file name."""
    params = write_params(tmp_path / "params.yaml", **TINY_PRETRAIN)
    with small_disk(ready.root / "checkpoints", "64k"):
        proc = _cli(params, ready.root)
        _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 4, err[-2000:]
    assert f"writing checkpoints under {ready.pretrain_checkpoints}: [" in err and "Traceback" not in err, err[-2000:]
    assert not ready.dapt.exists()


def _cli(params: Path, root: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(root), "pretrain"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_processes_with_gloo(ready: Paths, tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", **{**TINY_PRETRAIN, "pretrain.nproc": 2, "pretrain.max_steps": 4})
    log = tmp_path / "samples"
    proc = _cli(params, ready.root, ADAPTBERT_SAMPLE_LOG=str(log))
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    report = read_report(ready.pretrain_report, PretrainReport)
    assert report.world_size == 2 and report.global_step == 4 and report.global_batch == 8
    rank0 = set(Path(f"{log}.rank0").read_text().splitlines())
    rank1 = set(Path(f"{log}.rank1").read_text().splitlines())
    assert len(rank0) >= 16 and len(rank1) >= 16 and not rank0 & rank1  # each rank trained on its own blocks
    from transformers import AutoModelForMaskedLM

    AutoModelForMaskedLM.from_pretrained(ready.dapt)


@pytest.mark.parametrize("objective", ["sop", "nsp"])
def test_sentence_objective_trains_a_pretraining_head(project, objective: str) -> None:
    cfg, paths = project
    validate.run(cfg, paths)
    with_pairs = make_config(**{"tokenize.sentence_pairs": True})
    tokenize.run(with_pairs, paths)
    cfg_s = make_config(
        **{
            **TINY_PRETRAIN,
            "tokenize.sentence_pairs": True,
            "pretrain.sentence_objective": objective,
            "pretrain.masking": "token",
            "pretrain.sentence_loss_weight": 0.5,
        }
    )
    report = pretrain.run(cfg_s, paths)
    assert report.global_step == 6 and report.adapted_perplexity > 0
    config = json.loads((paths.dapt / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"]
    from transformers import AutoModelForMaskedLM

    AutoModelForMaskedLM.from_pretrained(paths.dapt)  # the encoder + MLM head load for fine-tuning


def test_tokenize_outputs_older_than_the_params_name_the_stage_to_rerun(ready: Paths) -> None:
    """Valid params that ask for sentence pairs, over blocks tokenized without them (``ready``): re-run tokenize."""
    from pipeline.core.errors import MissingInput

    cfg = make_config(
        **{
            **TINY_PRETRAIN,
            "pretrain.sentence_objective": "sop",
            "pretrain.masking": "token",
            "tokenize.sentence_pairs": True,
        }
    )
    with pytest.raises(
        MissingInput, match=r"pretrain/train_pairs: \[missing-input\] no sentence pairs; run `dvc repro tokenize`"
    ):
        pretrain.run(cfg, ready)


def test_same_seed_same_model(ready: Paths) -> None:
    cfg = make_config(**{**TINY_PRETRAIN, "pretrain.max_steps": 3})
    first = pretrain.run(cfg, ready)
    a = load_file(ready.dapt / "model.safetensors")
    import shutil

    shutil.rmtree(ready.pretrain_checkpoints)
    second = pretrain.run(cfg, ready)
    b = load_file(ready.dapt / "model.safetensors")
    assert first.base_perplexity == second.base_perplexity
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_head_warmup_keeps_the_encoder_until_it_ends(ready: Paths) -> None:
    """With head_warmup_steps: 2 the encoder is untouched at step 2 while the MLM head moved; step 3 trains it."""
    from transformers import AutoTokenizer, set_seed

    cfg = make_config(
        **{**TINY_PRETRAIN, "pretrain.max_steps": 3, "pretrain.head_warmup_steps": 2, "pretrain.save_steps": 2}
    )
    set_seed(cfg.seed)  # as pretrain.run does before building the model
    initial = {
        k: v.clone()
        for k, v in pretrain_model.build_model(
            cfg.pretrain, AutoTokenizer.from_pretrained(ready.tokenizer), ready.tokenizer, 128
        )
        .state_dict()
        .items()
    }
    pretrain.run(cfg, ready)
    at_2 = load_file(ready.pretrain_checkpoints / "checkpoint-2" / "model.safetensors")
    final = load_file(ready.dapt / "model.safetensors")
    encoder = [k for k in at_2 if k.startswith("bert.")]
    assert encoder and all(torch.equal(at_2[k], initial[k]) for k in encoder)
    assert not torch.equal(
        at_2["cls.predictions.transform.dense.weight"], initial["cls.predictions.transform.dense.weight"]
    )
    assert not torch.equal(
        final["bert.encoder.layer.0.attention.self.query.weight"],
        initial["bert.encoder.layer.0.attention.self.query.weight"],
    )


def test_head_only_steps_run_no_backward_through_the_encoder(ready: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head-only step costs the encoder's forward pass only: its output needs no gradient (nothing is recorded
    through it), and from the first full step on it does again."""
    seen: list[bool] = []
    build = pretrain_model.build_model

    def hooked(*args: Any, **kwargs: Any) -> Any:
        model = build(*args, **kwargs)
        model.bert.register_forward_hook(
            lambda mod, _a, out: seen.append(out[0].requires_grad) if mod.training else None
        )
        return model

    monkeypatch.setattr(pretrain_run, "build_model", hooked)
    cfg = make_config(**{**TINY_PRETRAIN, "pretrain.max_steps": 4, "pretrain.head_warmup_steps": 2}, precision="fp32")
    pretrain.run(cfg, ready)
    assert seen == [False, False, True, True]


@pytest.mark.slow
def test_torch_compile_runs(ready: Paths) -> None:
    """torch.compile on the fixed-shape blocks (inductor on CPU here; compiles once, ~30 s), observed: dynamo
    captured graphs during the run (a setting the Trainer ignored would train eagerly and pass the rest)."""
    from torch._dynamo.utils import counters

    counters.clear()
    report = pretrain.run(
        make_config(**{**TINY_PRETRAIN, "pretrain.torch_compile": True, "pretrain.max_steps": 4}), ready
    )
    assert report.global_step == 4 and report.adapted_perplexity < report.base_perplexity
    assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])


def test_task_text_adds_the_tasks_train_inputs_and_nothing_they_are_evaluated_on(ready: Paths) -> None:
    """DAPT+TAPT: the packed task text is every distinct train input, and no validation/test input."""
    from transformers import AutoTokenizer

    from pipeline.text import demo_domain as demo

    tok = AutoTokenizer.from_pretrained(ready.tokenizer)
    blocks, _ = open_group(ready.pretrain_blocks, "task_text")
    text = " ".join(tok.decode(b) for b in blocks["input_ids"]).replace(" - ", "-")  # decode spaces the hyphen
    report = read_report(ready.tokenize_report, TokenizeReport).task_text
    assert report.blocks == len(blocks) > 0 and report.documents > 0
    world = demo.build_world(make_config().demo)
    names = {d.name: d.split for d in world.drugs} | world.targets
    seen = {n for n in names if n in text}
    assert seen and {names[n] for n in seen} == {"train"}  # demo names: evaluation splits name other drugs
    plain = pretrain.run(make_config(**TINY_PRETRAIN), ready)
    with_tasks = pretrain.run(make_config(**TINY_PRETRAIN, **{"pretrain.task_text": True}), ready)
    assert plain.task_text_blocks == 0 and with_tasks.task_text_blocks == len(blocks)
    assert with_tasks.train_blocks == plain.train_blocks + len(blocks)
    assert with_tasks.resumed_from is None  # the other run's checkpoints are not resumed: different data


BUDGET = {
    **TINY_PRETRAIN,
    "pretrain.max_steps": 100_000,
    "pretrain.warmup_steps": 10,  # the plan is made at step 10, within warmup: the schedule is exact
    "pretrain.eval_steps": 40,
    "pretrain.save_steps": 40,
}


def test_a_time_budget_plans_the_steps_that_end_on_it_and_decays_the_lr_over_them(ready: Paths) -> None:
    cfg = make_config(**{**BUDGET, "pretrain.budget_minutes": 0.25})  # 15 s of training
    report = pretrain.run(cfg, ready)
    plan = report.budget.plan
    assert plan["planned_at_step"] == budget.WarmupTimer.WARMUP_STEPS + budget.BUDGET_CALIBRATION
    assert report.global_step == plan["planned_steps"] < 100_000 and not plan["capped_by_max_steps"]
    # the plan fills the 15 s with the step time it measured (the warm-up steps before it took some of them) ...
    assert 0.5 * 15 < plan["planned_steps"] * plan["seconds_per_step"] <= 15 * 1.05
    # ... and the run ends near it, unless the machine slows down after the plan was made: with another test
    # worker starting beside it, 40 s were seen (steps 2.7x slower than when measured)
    assert 7 < report.train_seconds < 15 * 4
    assert report.budget.minutes_asked == 0.25 and report.budget.epochs > 0
    rows = _curves(ready)
    peak, total, warm = cfg.pretrain.learning_rate, plan["planned_steps"], cfg.pretrain.warmup_steps
    assert len(rows) == total > warm + 3
    for row in rows[warm:]:  # linear decay to 0 over exactly the planned steps
        step = int(row["step"]) - 1  # the Trainer logs the rate the next step will use: that of `step` done
        assert float(row["learning_rate"]) == pytest.approx(
            peak * (1 - (step - warm) / (total - warm)), rel=1e-3, abs=1e-9
        )
    assert json.loads((ready.pretrain_checkpoints / budget.BUDGET_PLAN).read_text()) == plan
    again = pretrain.run(cfg, ready)  # resumed: the saved plan holds, nothing more is trained
    assert again.global_step == report.global_step and again.budget.plan == plan


def test_max_steps_caps_a_budget_and_a_bad_budget_names_the_key(ready: Paths) -> None:
    cfg = make_config(**{**BUDGET, "pretrain.max_steps": 14, "pretrain.budget_minutes": 60.0})
    report = pretrain.run(cfg, ready)
    assert report.global_step == 14 and report.budget.plan["capped_by_max_steps"]
    assert "budget 60 min" in pretrain.summary(report, cfg, ready)
    from pipeline.core.config import ConfigError

    for bad in (0, -1.0):
        with pytest.raises(ConfigError, match=r"pretrain\.budget_minutes"):
            make_config(**{"pretrain.budget_minutes": bad})
