"""Compression on a tiny BERT: INT8 round trip, backend choice, student init, head slicing, distillation losses."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from pipeline.compression.distill import distillation_loss, student_from_teacher, student_layers
from pipeline.compression.prune import gated_heads, head_count, head_importance, heads_to_keep, slice_heads
from pipeline.compression.quantize import choose_backend, is_int8, quantize
from pipeline.compression.variants import load_model, save_variant, variant_meta
from pipeline.core.errors import DataError
from pipeline.core.sections.finetune import FinetuneTaskConfig
from pipeline.tasks.base import pad_with_float_labels
from pipeline.tasks.registry import REGISTRY, kind_of
from pipeline.tasks.spec import TaskSpec
from pipeline.training.multitask import MultiTaskModel
from tests.model.test_multitask import SPECS, VOCAB, batch_for

ALL_SPECS = [
    *SPECS,
    TaskSpec("tags", "multilabel_classification", ["x", "y", "z"], FinetuneTaskConfig()),
    TaskSpec("score", "regression", [], FinetuneTaskConfig()),
]


def encoder(layers: int = 4, heads: int = 4) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config, add_pooling_layer=False)


def model(layers: int = 4) -> MultiTaskModel:
    return MultiTaskModel(encoder(layers), ALL_SPECS, dropout=0.0).eval()


def batch(task: str) -> dict[str, torch.Tensor]:
    if task in ("tags", "score"):
        base = batch_for("seq")
        features = [
            {
                "input_ids": ids[mask.bool()].tolist(),
                "labels": [float(i % 2), 1.0, 0.0] if task == "tags" else 0.5 * i,
            }
            for i, (ids, mask) in enumerate(zip(base["input_ids"], base["attention_mask"], strict=True))
        ]
        out = pad_with_float_labels(features, pad_id=0)
        out["task"] = task
        return out
    return batch_for(task)


def inputs(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in b.items() if k in ("task", "input_ids", "attention_mask", "token_type_ids")}


TASKS = [s.name for s in ALL_SPECS]


# ----------------------------------------------------------------------------- INT8


@pytest.mark.parametrize(
    ("requested", "supported", "flags", "machine", "engine", "fell_back"),
    [
        ("auto", ["qnnpack", "x86", "fbgemm", "onednn"], {"avx512_vnni"}, "x86_64", "x86", False),
        ("auto", ["qnnpack", "x86", "fbgemm"], {"amx_int8"}, "x86_64", "x86", False),
        ("auto", ["qnnpack", "x86", "fbgemm"], {"avx2"}, "x86_64", "fbgemm", False),
        ("auto", ["qnnpack"], set(), "aarch64", "qnnpack", False),
        ("onednn", ["x86", "fbgemm"], {"avx512_vnni"}, "x86_64", "x86", True),  # asked, missing: the next one
        ("auto", ["fbgemm"], {"avx_vnni"}, "x86_64", "fbgemm", True),
    ],
)
def test_the_int8_backend_is_chosen_like_precision_auto(
    requested: str, supported: list[str], flags: set[str], machine: str, engine: str, fell_back: bool
) -> None:
    backend = choose_backend(requested, supported, frozenset(flags), machine)
    assert backend.engine == engine
    assert bool(backend.fallbacks) == fell_back
    if fell_back:
        assert "not in this PyTorch build" in backend.fallbacks[0] and "fell back" in backend.reason


def test_no_int8_backend_is_a_clear_error() -> None:
    with pytest.raises(DataError, match=r"no-int8-backend.*remove int8 variants"):
        choose_backend("auto", ["none"], frozenset({"avx512_vnni"}), "x86_64")


def test_int8_round_trip_saves_loads_and_predicts_the_same(tmp_path: Path) -> None:
    full = model()
    backend = choose_backend("auto", torch.backends.quantized.supported_engines, frozenset(), "x86_64")
    q = quantize(full, backend, per_channel=True)
    assert is_int8(q) and not is_int8(full)
    tasks_json = json.dumps(
        [{"name": s.name, "type": s.type, "labels": s.labels, "settings": s.settings.model_dump()} for s in ALL_SPECS]
    )
    from transformers import BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]))
    tok = BertTokenizerFast(vocab_file=str(vocab))
    save_variant(q, tok, tmp_path / "int8", variant_meta("int8", None, None, backend, "auto", True), "card", tasks_json)
    loaded, _ = load_model(tmp_path / "int8")
    assert is_int8(loaded)
    for task in TASKS:
        b = inputs(batch(task))
        with torch.inference_mode():
            mine, theirs, fp32 = (m(**b)["logits"] for m in (q, loaded, full))
        assert torch.equal(mine, theirs), task  # the same int8 weights, bit for bit
        assert torch.allclose(mine, fp32, atol=0.15), task  # and close to the fp32 model
        assert not torch.equal(mine, fp32), task  # (it did quantise)
    size = (tmp_path / "int8" / "model.safetensors").stat().st_size
    assert size < sum(p.numel() * 4 for p in full.parameters())


def test_a_corrupt_variant_names_the_file_and_the_stage(tmp_path: Path) -> None:
    test_int8_round_trip_saves_loads_and_predicts_the_same(tmp_path)
    weights = tmp_path / "int8" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(DataError, match=r"corrupt-model.*re-run compress"):
        load_model(tmp_path / "int8")


# ----------------------------------------------------------------------------- distillation


def test_the_student_starts_from_the_teachers_layers_and_heads() -> None:
    teacher = model(layers=4)
    layers = student_layers(4, None)
    assert layers == [0, 2]
    student = student_from_teacher(teacher, layers)
    assert student.encoder.config.num_hidden_layers == 2 and len(student.encoder.encoder.layer) == 2
    assert teacher.encoder.config.num_hidden_layers == 4  # the teacher is untouched
    t, s = teacher.state_dict(), student.state_dict()
    for key, value in s.items():
        if ".encoder.layer." in key:
            index = int(key.split(".encoder.layer.")[1].split(".")[0])
            source = key.replace(f".encoder.layer.{index}.", f".encoder.layer.{layers[index]}.")
        else:
            source = key  # embeddings and every head
        assert torch.equal(value, t[source]), key
    with pytest.raises(ValueError, match=r"it has layers 0\.\.3"):
        student_layers(4, [1, 4])


@pytest.mark.parametrize("task", TASKS)
def test_the_distillation_loss_of_each_head_type_is_least_at_the_teachers_logits(task: str) -> None:
    spec = next(s for s in ALL_SPECS if s.name == task)
    kind = kind_of(spec.type)
    b = batch(task)
    with torch.no_grad():
        teacher_logits = model()(**inputs(b))["logits"]
    same = teacher_logits.clone().requires_grad_(True)
    loss = kind.distill_loss(same, teacher_logits, b, temperature=2.0)
    (grad,) = torch.autograd.grad(loss, same)
    mask = b["attention_mask"].bool()
    if grad.ndim == 3 and spec.type == "token_classification":
        grad = grad[mask]
    assert torch.isfinite(loss) and grad.abs().max() < 1e-5  # a minimum: no pull away from the teacher
    other = teacher_logits + torch.randn_like(teacher_logits)
    assert kind.distill_loss(other, teacher_logits, b, 2.0) > loss + 1e-4


def test_token_soft_targets_ignore_padding() -> None:
    b = batch("ner")
    t = torch.randn(*b["input_ids"].shape, 3)
    s = torch.randn_like(t)
    moved = s.clone()
    moved[~b["attention_mask"].bool()] += 100.0  # only padded positions change
    kind = REGISTRY["token_classification"]
    assert kind.distill_loss(s, t, b, 2.0) == pytest.approx(kind.distill_loss(moved, t, b, 2.0).item())


def test_distillation_mixes_soft_and_gold_losses_and_never_trains_the_teacher() -> None:
    teacher = model()
    student = student_from_teacher(teacher, [0, 2]).eval()  # no dropout: the two losses see the same forward
    b = batch("seq")
    gold = student(**b)["loss"].item()
    assert distillation_loss(teacher, alpha=0.0, temperature=2.0)(student, b)["loss"].item() == pytest.approx(gold)
    out = distillation_loss(teacher, alpha=1.0, temperature=2.0)(student, b)
    out["loss"].backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.requires_grad for p in teacher.parameters())  # a later copy of it (the pruned variant) still trains
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert out["loss"].item() == pytest.approx(out["soft_loss"].item())


# ----------------------------------------------------------------------------- head pruning


def test_slicing_no_head_away_is_the_identity() -> None:
    full = model()
    sliced = copy.deepcopy(full)
    slice_heads(sliced.encoder, {layer: [0, 1, 2, 3] for layer in range(4)})
    for task in TASKS:
        b = inputs(batch(task))
        with torch.inference_mode():
            assert torch.equal(full(**b)["logits"], sliced(**b)["logits"]), task


def test_sliced_heads_compute_exactly_what_they_did_with_the_others_gated_off() -> None:
    full = model()
    keep = {0: [1, 3], 1: [0], 2: [0, 1, 2, 3], 3: [2]}
    gates = [torch.tensor([1.0 if h in keep[layer] else 0.0 for h in range(4)]) for layer in range(4)]
    sliced = copy.deepcopy(full)
    slice_heads(sliced.encoder, keep)
    assert head_count(sliced.encoder) == [2, 1, 4, 1]
    assert sliced.encoder.encoder.layer[0].attention.self.query.weight.shape == (16, 32)
    assert sliced.encoder.encoder.layer[0].attention.output.dense.weight.shape == (32, 16)
    for task in TASKS:
        b = inputs(batch(task))
        with torch.inference_mode():
            with gated_heads(full.encoder, gates):
                gated = full(**b)["logits"]
            assert torch.allclose(gated, sliced(**b)["logits"], atol=1e-5), task
            assert not torch.allclose(gated, full(**b)["logits"], atol=1e-3), task  # the gates did remove heads


def test_a_pruned_variant_round_trips(tmp_path: Path) -> None:
    full = model()
    slice_heads(full.encoder, {0: [0], 3: [1, 2]})
    tasks_json = json.dumps(
        [{"name": s.name, "type": s.type, "labels": s.labels, "settings": s.settings.model_dump()} for s in ALL_SPECS]
    )
    from transformers import BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]))
    meta = variant_meta("pruned", None, {0: [0], 3: [1, 2]}, None, "auto", True)
    save_variant(full, BertTokenizerFast(vocab_file=str(vocab)), tmp_path / "p", meta, "card", tasks_json)
    loaded, _ = load_model(tmp_path / "p")
    assert head_count(loaded.encoder) == [1, 4, 4, 2]
    b = inputs(batch("qa"))
    with torch.inference_mode():
        assert torch.equal(full(**b)["logits"], loaded(**b)["logits"])


def test_heads_to_keep_removes_the_least_important_and_leaves_every_layer_one() -> None:
    importance = np.array([[0.9, 0.1, 0.5, 0.2], [0.05, 0.04, 0.03, 0.02], [1.0, 1.0, 1.0, 1.0]])
    keep = heads_to_keep(importance, fraction=0.5)  # 6 of 12 heads go
    assert sum(len(h) for h in keep.values()) == 6
    assert keep[1] == [0]  # the least important layer keeps its best head
    assert keep[2] == [0, 1, 2, 3]
    assert keep[0] == [0]  # 0.1, 0.2 and 0.5 go after the layer-1 heads that may go
    assert heads_to_keep(importance, fraction=0.01) == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3]}


def test_head_importance_is_normalised_per_layer_and_reacts_to_the_loss() -> None:
    from pipeline.training.multitask import TaskData

    class Split:  # a feature split: ``features[a:b]`` gives columns, like datasets.Dataset
        def __init__(self, rows: list[dict]) -> None:
            self.rows = rows

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, s: slice) -> dict:
            return {k: [r[k] for r in self.rows[s]] for k in self.rows[0]}

    b = batch_for("seq")
    rows = [
        {"input_ids": ids[m.bool()].tolist(), "labels": int(lab)}
        for ids, m, lab in zip(b["input_ids"], b["attention_mask"], b["labels"], strict=True)
    ]
    full = model()
    data = {"seq": TaskData(ALL_SPECS[0], {"validation": Split(rows)}, {})}
    importance = head_importance(full, data, pad_id=0, batch_size=4, batches=2)
    assert importance.shape == (4, 4) and (importance >= 0).all()
    assert np.allclose(np.linalg.norm(importance, axis=1), 1.0)
