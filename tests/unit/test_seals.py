"""Seals: a JSON output carries the SHA-256 of its content, a folder output ``.sealed.json`` with that of every file;
a reader that checks them refuses any change, naming the file (``[corrupt-output]``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.errors import DataError, MissingInput
from pipeline.core.io import SEAL_FILE, SEAL_KEY, check_json_seal, seal_folder, sealed, transaction
from pipeline.core.seals import check_folder_seal

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


# the seal's own key is reserved: a report never has a field of that name (hypothesis found "_seal": None)
@given(st.dictionaries(st.text(max_size=6).filter(lambda k: k != SEAL_KEY), values, max_size=5))
def test_a_sealed_object_written_and_read_back_passes_its_check(report: dict) -> None:
    on_disk = json.loads(json.dumps(sealed(report), indent=2, ensure_ascii=False))
    assert json.dumps(check_json_seal(Path("r.json"), on_disk)) == json.dumps(json.loads(json.dumps(report)))


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (lambda r: r.pop("_seal"), "has no seal"),
        (lambda r: r.update(steps=301), "its content is not what its stage wrote"),
        (lambda r: r["tasks"].pop("ner"), "its content is not what its stage wrote"),
    ],
)
def test_a_changed_or_unsealed_object_is_refused_naming_the_file(change, detail: str, tmp_path: Path) -> None:
    report = sealed({"steps": 300, "tasks": {"ner": 0.8, "qa": 0.6}})
    change(report)
    path = tmp_path / "reports" / "pretrain.json"
    with pytest.raises(DataError) as info:
        check_json_seal(path, report)
    assert info.value.rule == "corrupt-output" and info.value.path == str(path)
    assert detail in info.value.detail and "re-run `dvc repro pretrain`" in str(info.value)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """models/dapt as its stage commits it: two files and a sub-folder, sealed by the transaction."""
    with transaction(tmp_path, "pretrain") as txn:
        out = txn.dir(tmp_path / "models" / "dapt")
        (out / "config.json").write_text('{"hidden_size": 8}')
        (out / "model.safetensors").write_bytes(b"weights" * 100)
        (out / "sub").mkdir()
        (out / "sub" / "vocab.txt").write_text("a\nb\n")
    return tmp_path / "models" / "dapt"


def test_a_committed_folder_is_sealed_and_passes(folder: Path) -> None:
    listed = json.loads((folder / SEAL_FILE).read_text())["sha256"]
    assert sorted(listed) == ["config.json", "model.safetensors", "sub/vocab.txt"]
    check_folder_seal(folder)


@pytest.mark.parametrize(
    ("damage", "file", "rule"),
    [
        (lambda f: (f / "model.safetensors").write_bytes(b"weights" * 50), "model.safetensors", "corrupt-output"),
        (lambda f: (f / "sub" / "vocab.txt").write_text("a\nc\n"), "sub/vocab.txt", "corrupt-output"),
        (lambda f: (f / "config.json").unlink(), "config.json", "missing-input"),
        (lambda f: (f / SEAL_FILE).write_text('{"unexpected": 1}'), SEAL_FILE, "corrupt-output"),
        (lambda f: (f / SEAL_FILE).write_text('{"sha256": {"../x": "0"}}'), SEAL_FILE, "corrupt-output"),
        (lambda f: (f / SEAL_FILE).unlink(), "", "corrupt-output"),
    ],
)
def test_a_damaged_folder_names_the_file_and_the_stage(folder: Path, damage, file: str, rule: str) -> None:
    damage(folder)
    with pytest.raises(DataError) as info:
        check_folder_seal(folder)
    assert info.value.rule == rule and info.value.path == str(folder / file).rstrip("/")
    assert "dvc repro pretrain" in str(info.value)


def test_a_part_of_a_folder_is_checked_alone(folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"other")
    check_folder_seal(folder, folder / "sub")  # a reader of sub/ only is not stopped by the other file
    with pytest.raises(DataError, match=r"model\.safetensors"):
        check_folder_seal(folder)


def test_sealing_again_after_a_change_passes(folder: Path) -> None:
    (folder / "config.json").write_text("{}")
    seal_folder(folder)
    check_folder_seal(folder)
    (folder / "config.json").unlink()
    with pytest.raises(MissingInput):
        check_folder_seal(folder)
