"""Values that passed params validation and failed hours later (in compress, register, evaluate, tokenize) are
refused before any stage works, with the key and what is wrong (exit 2), or named as bad data at once (exit 3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.base_model import base_model_layers, check_against_base_model
from pipeline.core.config import ConfigError
from pipeline.core.errors import DataError
from pipeline.text.vocab import read_terms
from tests.conftest import ROOT, TINY_PRETRAIN, make_config, write_params


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", ["bio.bert", "team/adaptbert", "adapt:bert", "50%", "it's", "   "])
def test_a_model_name_mlflow_would_refuse_at_register_is_a_config_error(name: str) -> None:
    with pytest.raises(ConfigError, match=r"register\.model_name"):
        make_config(**{"register.model_name": name})
    assert make_config(**{"register.model_name": "bio-bert_v2 large"}).registration.model_name == "bio-bert_v2 large"


@pytest.mark.parametrize(
    ("overrides", "layers", "refused"),
    [
        (TINY_PRETRAIN, [0, 1], False),  # a 2-layer scratch model
        (TINY_PRETRAIN, [0, 2], True),
        ({"pretrain.base_model": "minilm"}, [1, 3, 5], False),  # MiniLM has 6 layers
        ({"pretrain.base_model": "minilm"}, [0, 6], True),
        ({"pretrain.base_model": "minilm", "compress.enabled": False}, [0, 6], False),  # no compress stage
    ],
)
def test_student_layers_beyond_the_base_models_depth_are_refused_before_any_stage(
    overrides: dict, layers: list[int], refused: bool
) -> None:
    cfg = make_config(**overrides, **{"compress.distill.student_layers": layers})
    if refused:
        with pytest.raises(ConfigError, match=rf"student_layers: \[.*\] names layer {layers[-1]}, but the teacher"):
            check_against_base_model(cfg)
    else:
        check_against_base_model(cfg)


def test_the_base_models_depth_comes_from_its_config_or_is_unknown() -> None:
    assert base_model_layers(make_config(**TINY_PRETRAIN).pretrain) == 2
    assert base_model_layers(make_config(**{"pretrain.base_model": "minilm"}).pretrain) == 6
    assert base_model_layers(make_config(**{"pretrain.base_model": "org/some-hub-model"}).pretrain) is None


def test_the_first_stage_refuses_impossible_student_layers_before_it_works(tmp_path: Path) -> None:
    """Was: ingest .. finetune ran (hours on real data), then compress raised a ValueError (an internal error)."""
    params = write_params(tmp_path / "params.yaml", **{"compress.distill.student_layers": [0, 2, 7]})
    proc = _cli(tmp_path, "--params", str(params), "demo")
    assert proc.returncode == 2, proc.stderr
    assert "compress.distill.student_layers: [0, 2, 7] names layer 7" in proc.stderr and "6 layers" in proc.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("args", [["promote", "abc"], ["promote", "0"], ["compare", "3", "latest"]])
def test_a_version_that_is_not_one_is_a_usage_error_before_the_registry_is_opened(
    tmp_path: Path, args: list[str]
) -> None:
    proc = _cli(tmp_path, "--params", str(ROOT / "params.yaml"), "models", *args)
    assert proc.returncode == 2 and "is neither a version number (e.g. 3) nor one of champion" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no mlflow.db was created to say so


def test_domain_terms_that_are_not_utf8_name_the_line_and_byte(tmp_path: Path) -> None:
    """Was: a UnicodeDecodeError (an internal error) at the start of tokenize."""
    (tmp_path / "terms.txt").write_bytes("zorvatinib\r\nmyélite\n".encode("latin-1"))
    with pytest.raises(DataError) as info:
        read_terms("terms.txt", tmp_path)
    assert (info.value.line, info.value.rule) == (2, "invalid-utf8") and "byte 2 (0xe9)" in info.value.detail
    (tmp_path / "terms.txt").write_text("zorvatinib\r\n\n myélite \n", encoding="utf-8")
    assert read_terms("terms.txt", tmp_path) == ["zorvatinib", "myélite"]


def test_a_reader_that_closes_the_pipe_early_gets_no_error_message(tmp_path: Path) -> None:
    """`adaptbert config show | head -1`: the closed pipe ended as "[operating system error] Broken pipe"."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "--params", str(ROOT / "params.yaml"), "config", "show"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes its first line
    assert proc.wait(timeout=60) == 0 and proc.stderr.read() == b""
