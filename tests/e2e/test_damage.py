"""Every output the stage table declares, damaged, is refused by every stage that reads it.

The cases come from the declarations, not from a list kept here: each stage's ``outputs`` and ``inputs`` in the stage
table (``pipeline/core/stages.py``; the inputs are dvc.yaml's ``deps``, tests/architecture checks it) give the
(output, consumer) pairs, so a new output joins this test by being declared. In a built tiny project, the files of
each output a consumer reads (one per kind and folder, and the output's seal) are damaged one at a time (cut to half,
zero bytes, garbage, a valid file of the wrong shape) and the consumer is run through the CLI: it must exit 3 or 4
naming the file, print no traceback, and leave its own outputs as they were.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.__main__ import main
from pipeline.core.io import SEAL_FILE
from pipeline.core.paths import Paths
from pipeline.core.stages import STAGES, stage_record
from tests.conftest import TINY_COMPRESS, TINY_FINETUNE, TINY_PRETRAIN, copy_project, write_params

pytestmark = pytest.mark.slow


def _pairs() -> Iterator[tuple[str, str]]:
    """(output, consumer) for every declared output and every stage that declares it (or a part of it) as an input."""
    relative = Paths(Path())
    for stage in STAGES:
        for output in stage.outputs:
            out = getattr(relative, output)
            for consumer in STAGES:
                parts = [getattr(relative, name) for name in consumer.inputs]
                if any(p == out or out in p.parents for p in parts):
                    yield output, consumer.name


PAIRS = list(_pairs())

# Declared outputs that no stage reads, with who does: nothing to run after damaging them. A new output is either an
# input of some stage (then it joins PAIRS) or listed here.
READ_BY_NO_STAGE = {
    "data_docs": "people (the Data Docs pages)",
    "select_report": "people and MLflow (select's numbers)",
    "embeddings": "select itself: its cache, keyed by content hash (a damaged file is recomputed, never trusted)",
    "pretrain_checkpoints": "pretrain itself on resume (checked: tests/model/test_pretrain.py, set aside when bad)",
    "finetune_checkpoints": "finetune itself on resume (the same checks)",
    "compress_checkpoints": "compress itself on resume (the same checks)",
    "adapt_checkpoints": "adapt itself on resume (a finished arm's result that does not read back is trained again: "
    "tests/model/test_adapt.py)",
    "evaluation": "people (evaluation.md)",
    "predictions": "people and the error analysis' readers (one JSONL per task)",
    "compression_markdown": "people (compression.md)",
    "summary": "dvc metrics show and the MLflow note (no stage)",
    "run_report": "people (index.html)",
}


def test_every_declared_output_is_read_by_a_stage_or_says_who_reads_it() -> None:
    consumed = {output for output, _ in PAIRS}
    unread = {output for stage in STAGES for output in stage.outputs if output not in consumed}
    assert unread == set(READ_BY_NO_STAGE)


def _wrong_shape(path: Path) -> bytes | None:
    """A valid file of ``path``'s format that holds the wrong thing (None: every file of the format is valid)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import save

    table = pa.table({"unexpected": [1, 2]})
    name = path.name
    if name.endswith((".json",)):
        return b'{"unexpected": [1, 2]}'
    if name.endswith(".jsonl"):
        return b'{"unexpected": 1}\n'
    if name.endswith(".jsonl.gz"):
        return gzip.compress(b'{"unexpected": 1}\n')
    if name.endswith((".csv", ".tsv")):
        return b"unexpected\n1\n"
    if name.endswith(".conll"):
        return b"one two three four\n\n"
    if name.endswith(".parquet"):
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue()
    if name.endswith(".arrow"):
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue()
    if name.endswith(".safetensors"):
        return save({"unexpected": torch.zeros(2)})
    return None  # text lists, images: any well-formed one is a valid file of its kind


DAMAGES: dict[str, Callable[[Path], bytes | None]] = {
    "half": lambda p: p.read_bytes()[: p.stat().st_size // 2],
    "empty": lambda p: b"",
    "garbage": lambda p: random.Random(p.name).randbytes(max(64, min(p.stat().st_size, 4096))),
    "wrong shape": _wrong_shape,
}


@pytest.fixture(scope="module")
def built(finetuned, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny project with every declared output written (root, params.yaml): the session's fine-tuned project (demo to
    evaluate), then the other stages through the CLI."""
    root = copy_project(finetuned[1], tmp_path_factory.mktemp("damage")).root
    params = write_params(root / "params.yaml", **TINY_PRETRAIN, **TINY_FINETUNE, **TINY_COMPRESS)
    for stage in ("select", "adapt", "search", "compress", "register", "report"):
        assert main(["--root", str(root), "--params", str(params), stage]) == 0, stage
    missing = [f"{s.name}: {o}" for s in STAGES for o in s.outputs if not getattr(Paths(root), o).exists()]
    assert not missing, "the build should write every declared output"
    return root, params


def _files_read(root: Path, output: str, consumer: str) -> list[Path]:
    """The files of ``output`` that ``consumer`` declares as inputs: one per kind (suffix) and sub-folder, and the
    output's seal."""
    path = getattr(Paths(root), output)
    if path.is_file():
        return [path]
    parts = [getattr(Paths(root), name) for name in stage_record(consumer).inputs]
    chosen: dict[tuple[Path, str], Path] = {}
    for file in sorted(f for f in path.rglob("*") if f.is_file() and f.name != SEAL_FILE):
        if any(p == file or p in file.parents for p in parts):
            chosen.setdefault((file.parent, "".join(file.suffixes)), file)
    return [*chosen.values(), path / SEAL_FILE]


def _fingerprint(root: Path, stage: str) -> dict[str, str]:
    """SHA-256 of every file of ``stage``'s outputs (its run must not change them when it refuses its input)."""
    prints: dict[str, str] = {}
    for output in stage_record(stage).outputs:
        path = getattr(Paths(root), output)
        for file in [path] if path.is_file() else sorted(path.rglob("*")) if path.exists() else []:
            if file.is_file():
                prints[str(file.relative_to(root))] = hashlib.sha256(file.read_bytes()).hexdigest()
    return prints


def _keep_outputs(root: Path, stage: str, keep: Path) -> Path:
    """A copy of ``stage``'s outputs under ``keep`` (put back by :func:`_restore_outputs` if a run changed them)."""
    for output in stage_record(stage).outputs:
        path = getattr(Paths(root), output)
        if path.exists():
            target = keep / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, target)
    return keep


def _restore_outputs(keep: Path, root: Path) -> None:
    for file in [f for f in keep.rglob("*") if f.is_file()]:
        target = root / file.relative_to(keep)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, target)


@pytest.mark.parametrize(("output", "consumer"), PAIRS, ids=[f"{o}->{c}" for o, c in PAIRS])
def test_a_damaged_output_is_refused_by_its_consumer_naming_the_file(
    built: tuple[Path, Path], output: str, consumer: str, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root, params = built
    files = _files_read(root, output, consumer)
    assert files, f"{consumer} declares {output} as an input but reads none of its files"
    before = _fingerprint(root, consumer)
    kept = _keep_outputs(root, consumer, tmp_path)
    problems: list[str] = []
    for file in files:
        good = file.read_bytes()
        try:
            for damage, make in DAMAGES.items():
                content = make(file)
                if content is None:
                    continue
                file.write_bytes(content)
                capfd.readouterr()
                code = main(["--root", str(root), "--params", str(params), consumer])
                out, err = capfd.readouterr()
                case = f"{file.relative_to(root)} {damage}"
                if code not in (3, 4):
                    problems.append(f"{case}: exit {code}: {err.strip()[-300:]}")
                elif str(file.relative_to(root)) not in err and file.name not in err:
                    problems.append(f"{case}: the message does not name the file: {err.strip()[-300:]}")
                elif "Traceback" in out + err:
                    problems.append(f"{case}: a traceback was printed")
                file.write_bytes(good)
                if _fingerprint(root, consumer) != before:
                    problems.append(f"{case}: {consumer} changed its outputs")
                    _restore_outputs(kept, root)
        finally:
            file.write_bytes(good)
    assert not problems, "\n".join(problems)
