"""precision: auto | fp32 | bf16: the choice on sample machines, the errors, bf16 vs fp32 agreement, resume across a change."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.config import ConfigError
from pipeline.modelling import precision as prec
from pipeline.modelling.precision import Hardware, choose_precision, resolve_precision
from tests.conftest import TINY_PRETRAIN, make_config, write_params

SAPPHIRE_RAPIDS = Hardware(
    "cpu",
    "Intel(R) Xeon(R) Platinum 8480+",
    cpu_flags=frozenset(
        ["fpu", "sse4_2", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"]
    ),
)
COOPER_LAKE = Hardware(
    "cpu", "Intel(R) Xeon(R) Platinum 8380H", cpu_flags=frozenset(["avx2", "avx512f", "avx512_vnni", "avx512_bf16"])
)
ZEN3 = Hardware("cpu", "AMD EPYC 7B13", cpu_flags=frozenset(["sse4_2", "avx2", "fma"]))
SKYLAKE = Hardware("cpu", "Intel(R) Xeon(R) Gold 6148", cpu_flags=frozenset(["avx2", "avx512f", "avx512bw"]))
GRAVITON3 = Hardware("cpu", "Neoverse-V1", cpu_flags=frozenset(["fp", "asimd", "sve", "bf16", "i8mm"]))
H200 = Hardware("cuda", "NVIDIA H200", cuda_bf16=True)
V100 = Hardware("cuda", "Tesla V100-SXM2-16GB", cuda_bf16=False)

BF16_CAPABLE = resolve_precision("auto").bf16
needs_bf16 = pytest.mark.skipif(not BF16_CAPABLE, reason="this CPU/GPU has no hardware bf16")


@pytest.mark.parametrize(
    ("hw", "expected"),
    [
        (SAPPHIRE_RAPIDS, "bf16"),
        (COOPER_LAKE, "bf16"),
        (GRAVITON3, "bf16"),
        (H200, "bf16"),
        (ZEN3, "fp32"),
        (SKYLAKE, "fp32"),
        (V100, "fp32"),
    ],
)
def test_auto_picks_bf16_only_where_the_hardware_has_it(hw: Hardware, expected: str) -> None:
    chosen = choose_precision("auto", hw)
    assert chosen.name == expected and chosen.device == hw.device
    assert chosen.reason.startswith(f"precision: auto -> {expected}") and hw.name in chosen.reason


def test_auto_names_the_flags_it_found() -> None:
    assert "amx_bf16, avx512_bf16" in choose_precision("auto", SAPPHIRE_RAPIDS).reason
    assert "no AMX-BF16/AVX512-BF16" in choose_precision("auto", ZEN3).reason


def test_fp32_is_always_allowed_and_bf16_where_the_hardware_has_it() -> None:
    assert choose_precision("fp32", SAPPHIRE_RAPIDS).name == "fp32"
    assert choose_precision("bf16", COOPER_LAKE).name == "bf16"


@pytest.mark.parametrize("hw", [ZEN3, V100])
def test_bf16_without_hardware_names_the_key_and_the_hardware(hw: Hardware) -> None:
    with pytest.raises(ConfigError, match=rf"precision: bf16 needs hardware bf16, but .*{hw.name}"):
        choose_precision("bf16", hw)


def test_the_config_accepts_only_the_three_values() -> None:
    assert make_config(precision="fp32").precision == "fp32"
    with pytest.raises(ConfigError, match=r"precision: got 'fp16'"):
        make_config(precision="fp16")


def test_bf16_on_a_machine_without_it_exits_2_before_any_work(tmp_path, monkeypatch, capsys) -> None:
    from pipeline.__main__ import main

    monkeypatch.setattr(prec, "detect_hardware", lambda: ZEN3)
    params = write_params(tmp_path / "params.yaml", precision="bf16")
    for stage in ("pretrain", "finetune", "evaluate"):
        assert main(["--params", str(params), "--root", str(tmp_path), stage]) == 2
        err = capsys.readouterr().err
        assert f"{stage} failed: precision: bf16 needs hardware bf16, but CPU AMD EPYC 7B13 has no" in err
    assert not (tmp_path / "checkpoints").exists()


def test_this_machine_is_described_with_its_flags() -> None:
    hw = prec.detect_hardware()
    text = hw.describe()
    assert hw.name in text
    if hw.device == "cpu":
        assert "CPU flags:" in text


@needs_bf16
def test_bf16_scoring_agrees_with_fp32(finetuned) -> None:
    """The same fine-tuned model scores a demo test split in bf16 and in fp32: >= 99% identical predictions."""
    from pipeline.training.data import load_contender
    from pipeline.training.multitask import predict_logits, score_task

    cfg, paths, _, _ = finetuned
    model, tok, tasks = load_contender(paths.finetuned, cfg, paths, paths.task_features)
    fp32, bf16 = choose_precision("fp32", prec.detect_hardware()), resolve_precision("bf16")
    for name in ("role", "ner"):
        a = score_task(model, tasks[name], "test", tok.pad_token_id, 32, fp32)
        b = score_task(model, tasks[name], "test", tok.pad_token_id, 32, bf16)
        flat_a = [x for p in a.pred for x in (p if isinstance(p, list) else [p])]
        flat_b = [x for p in b.pred for x in (p if isinstance(p, list) else [p])]
        assert len(flat_a) == len(flat_b) >= 40
        agree = np.mean([x == y for x, y in zip(flat_a, flat_b, strict=True)])
        assert agree >= 0.99, (name, agree)
        logits_a = predict_logits(model, name, tasks[name].splits["test"], tok.pad_token_id, 32, fp32)
        logits_b = predict_logits(model, name, tasks[name].splits["test"], tok.pad_token_id, 32, bf16)
        assert not all(np.array_equal(x, y) for x, y in zip(logits_a, logits_b, strict=True))  # bf16 really ran
        spread = np.concatenate([x.ravel() for x in logits_a]).std()
        assert max(np.abs(x - y).max() for x, y in zip(logits_a, logits_b, strict=True)) < 0.1 * spread + 0.05


def test_resume_across_a_precision_change_is_refused_and_named(pretrained, tmp_path) -> None:
    from pipeline.stages import pretrain
    from tests.conftest import copy_project

    _, src = pretrained
    paths = copy_project(src, tmp_path)
    other = "fp32" if BF16_CAPABLE else None
    if other is None:
        pytest.skip("only fp32 runs here: no other precision to change to")
    report = pretrain.run(make_config(**TINY_PRETRAIN, precision=other), paths)
    assert report.resumed_from is None and report.precision == "fp32"
    assert any("precision bf16 -> fp32" in line and "moved them to" in line for line in report.checkpoint_log), (
        report.checkpoint_log
    )


@pytest.mark.parametrize(
    ("hw", "requested", "kernel"),
    [
        (SAPPHIRE_RAPIDS, "auto", prec.EAGER_CPU_DROPOUT),  # bf16 on a CPU: the flash-attention backward is slow
        (COOPER_LAKE, "bf16", prec.EAGER_CPU_DROPOUT),
        (SAPPHIRE_RAPIDS, "fp32", prec.EAGER_CPU_DROPOUT),  # fp32: PyTorch's dropout masks are the slow part
        (ZEN3, "auto", prec.EAGER_CPU_DROPOUT),
        (H200, "auto", "sdpa"),  # a GPU's flash attention is its fast path
    ],
)
def test_training_attention_is_eager_with_numpy_dropout_on_a_cpu(hw: Hardware, requested: str, kernel: str) -> None:
    assert choose_precision(requested, hw).training_attention == kernel


def nested_tiny_mlm() -> tuple:
    """A tiny BERT MLM inside a ModuleDict (nested, as the multi-task model's encoder is), on SDPA, in eval mode, with
    two inputs (the second padded)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"mlm": BertForMaskedLM(config)}).eval()
    model["mlm"].set_attn_implementation("sdpa")
    return model, torch.randint(5, 50, (2, 7)), torch.tensor([[1] * 7, [1] * 4 + [0] * 3])


def test_attention_kernel_switches_every_submodel_and_restores_it(tmp_path) -> None:
    import json

    import torch

    model, ids, mask = nested_tiny_mlm()
    with torch.no_grad():
        fused = model["mlm"](input_ids=ids, attention_mask=mask).logits
        with prec.attention_kernel(model, "eager"):
            assert model["mlm"].config._attn_implementation == "eager"
            assert model["mlm"].bert.config._attn_implementation == "eager"
            eager = model["mlm"](input_ids=ids, attention_mask=mask).logits
    assert model["mlm"].config._attn_implementation == "sdpa"
    assert torch.allclose(fused, eager, atol=1e-5)  # the same attention, another kernel
    with prec.attention_kernel(model, "eager"):
        model["mlm"].save_pretrained(tmp_path)
    assert not any("attn" in key for key in json.loads((tmp_path / "config.json").read_text()))
