"""Damaged model and checkpoint files: a ``[corrupt-model]`` naming the file and what rewrites it, or a checkpoint set
aside (``*.corrupt``, ``*.previous``) and training resumed from the last good one; never an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pipeline.core.errors import DataError
from pipeline.modelling.models import check_model_dir, check_weights
from pipeline.training.checkpoints import prepare_checkpoints, usable_checkpoint
from pipeline.training.multitask import load_encoder, read_specs


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer BERT saved as transformers saves one (config.json + model.safetensors)."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("bert") / "models" / "dapt"
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    BertModel(config).save_pretrained(folder)
    return folder


def _damaged_copy(src: Path, dst: Path, damage: str) -> Path:
    import shutil

    shutil.copytree(src, dst)
    if damage == "no config.json":
        (dst / "config.json").unlink()
    elif damage == "truncated config.json":
        (dst / "config.json").write_text((src / "config.json").read_text()[:40])
    elif damage == "config.json without model_type":
        (dst / "config.json").write_text(json.dumps({"hidden_size": 8}))
    elif damage == "truncated weights":
        (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:500])
    elif damage == "no weights":
        (dst / "model.safetensors").unlink()
    return dst


@pytest.mark.parametrize(
    ("damage", "file"),
    [
        ("no config.json", "config.json"),
        ("truncated config.json", "config.json"),
        ("config.json without model_type", "config.json"),
        ("truncated weights", "model.safetensors"),
        ("no weights", "model.safetensors"),
    ],
)
def test_a_damaged_model_directory_is_a_corrupt_model_naming_the_file(
    tiny_bert: Path, tmp_path: Path, damage: str, file: str
) -> None:
    # a user's base model: "restore or re-download it"
    base = _damaged_copy(tiny_bert, tmp_path / "my-base", damage)
    with pytest.raises(DataError) as info:
        load_encoder(base, "pretrain.base_model")
    err = info.value
    assert (err.rule, err.path) == ("corrupt-model", str(base / file))
    assert err.detail.startswith("pretrain.base_model: ") and "re-download" in err.detail
    # an output of the pipeline: the stage that writes it
    dapt = _damaged_copy(tiny_bert, tmp_path / "project" / "models" / "dapt", damage)
    with pytest.raises(DataError, match=r"\[corrupt-model\] .*re-run `dvc repro pretrain`"):
        load_encoder(dapt, "the adapted model")


def test_an_intact_model_directory_passes_the_checks(tiny_bert: Path) -> None:
    check_model_dir(tiny_bert, "pretrain.base_model")
    check_weights(tiny_bert, "pretrain.base_model")
    assert load_encoder(tiny_bert).config.num_hidden_layers == 1


@pytest.mark.parametrize("content", ['[{"name": "role", "ty', "{}", '[{"name": "role"}]', "\udcff"])
def test_a_damaged_tasks_json_is_a_corrupt_model_naming_the_stage_to_rerun(tmp_path: Path, content: str) -> None:
    model_dir = tmp_path / "models" / "finetuned"
    model_dir.mkdir(parents=True)
    (model_dir / "tasks.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(DataError) as info:
        read_specs(model_dir)
    assert (info.value.rule, info.value.path) == ("corrupt-model", str(model_dir / "tasks.json"))
    assert "re-run `dvc repro finetune`" in info.value.detail
    variant = tmp_path / "models" / "compressed" / "int8"
    variant.mkdir(parents=True)
    (variant / "tasks.json").write_text(content[:10], encoding="utf-8", errors="surrogateescape")
    with pytest.raises(DataError, match=r"re-run `dvc repro compress`"):
        read_specs(variant)


def _checkpoint(ckpt_dir: Path, step: int) -> Path:
    """A checkpoint with the files the Trainer writes (tiny tensors)."""
    ckpt = ckpt_dir / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    save_file({"w": torch.full((2,), float(step))}, str(ckpt / "model.safetensors"))
    torch.save({"state": {}, "param_groups": []}, ckpt / "optimizer.pt")
    torch.save({"last_epoch": step}, ckpt / "scheduler.pt")
    return ckpt


@pytest.mark.parametrize(
    "state",
    [{"log_history": []}, {"global_step": 3, "log_history": []}, [6], "not json"],
    ids=["no global_step", "another step", "not an object", "garbled"],
)
def test_a_checkpoint_whose_trainer_state_does_not_fit_is_set_aside(tmp_path: Path, state: object) -> None:
    """The Trainer resumes a state without ``global_step`` at step 0 with a later step's optimizer (it was a
    KeyError of ours before); the checkpoint is renamed ``*.corrupt`` and the previous one is used."""
    _checkpoint(tmp_path, 3)
    newest = _checkpoint(tmp_path, 6)
    text = state if isinstance(state, str) else json.dumps(state)
    (newest / "trainer_state.json").write_text(text)
    log: list[str] = []
    assert usable_checkpoint(tmp_path, log) == tmp_path / "checkpoint-3"
    assert (tmp_path / "checkpoint-6.corrupt").is_dir() and not newest.exists()
    assert len(log) == 1 and log[0].startswith("checkpoint-6 is unusable (") and "trainer_state" in log[0] + text


@pytest.mark.parametrize("marker", ['{"fingerprint": "ab', "[]", '{"settings": {}}', "\udcff"])
def test_an_unreadable_run_marker_moves_the_checkpoints_aside_and_starts_fresh(tmp_path: Path, marker: str) -> None:
    """``run.json`` says which run wrote the checkpoints; a truncated one was a JSONDecodeError (exit 1)."""
    ckpt_dir = tmp_path / "pretrain"
    _checkpoint(ckpt_dir, 3)
    (ckpt_dir / "run.json").write_bytes(marker.encode("utf-8", "surrogateescape"))
    log: list[str] = []
    assert prepare_checkpoints(ckpt_dir, "f1", log) is None
    assert (tmp_path / "pretrain.previous" / "checkpoint-3").is_dir()  # kept, not deleted
    assert "run.json" in log[0] and "moved them to" in log[0] and "starting fresh" in log[0]
    assert json.loads((ckpt_dir / "run.json").read_text())["fingerprint"] == "f1"
    # the new marker is read back: the same run resumes its own checkpoints
    _checkpoint(ckpt_dir, 2)
    assert prepare_checkpoints(ckpt_dir, "f1", log) == ckpt_dir / "checkpoint-2" and len(log) == 1
