"""Sharded pretraining blocks: runs of corpus row groups packed per shard, listed in a manifest; ``tokenize.engine:
ray`` writes the same files byte for byte on a real local Ray."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset

from pipeline.core.errors import DataError, MissingInput
from pipeline.core.io import check_json_seal, file_digest, read_report
from pipeline.core.paths import Paths
from pipeline.core.reports.pretrain import PretrainReport
from pipeline.modelling.shards import MANIFEST, open_group, read_manifest
from pipeline.stages import ingest, pretrain, tokenize, validate
from pipeline.text.corpus_shards import corpus_files, corpus_shards
from pipeline.text.vocab import raw_backend
from pipeline.training.stream import STREAM_STATE, BlockStream
from tests.conftest import ROOT, TINY_PRETRAIN, environment_skip, make_config, write_params

# row groups of 100 documents (~110 KB), corpus shards of 2 row groups (200 KB), block shards of up to 3 row groups
SHARDED = {"ingest.chunk_docs": 100, "ingest.shard_mb": 0.2, "tokenize.shard_docs": 250}


@pytest.fixture(scope="module")
def sharded(built_demo, tmp_path_factory: pytest.TempPathFactory) -> tuple[Paths, dict]:
    """The demo corpus ingested in row groups of 100 documents and tokenized in shards of at least 250."""
    _, demo = built_demo
    paths = Paths(tmp_path_factory.mktemp("sharded"))
    shutil.copytree(demo.demo, paths.demo)
    cfg = make_config(**SHARDED)
    ingest.run(cfg, paths)
    validate.run(cfg, paths)
    return paths, tokenize.run(cfg, paths)


def test_each_block_shard_packs_row_groups_of_one_corpus_shard_and_the_manifest_lists_it(sharded) -> None:
    paths, report = sharded
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths.tokenizer)
    records = read_manifest(paths.pretrain_blocks)
    assert len(corpus_shards(paths.corpus, "train")) > 1
    for split in ("train", "validation"):
        inputs = []  # per block shard, its corpus texts: each corpus shard's row groups, three at a time
        for corpus in corpus_files(paths.corpus, split):
            groups = pq.ParquetFile(corpus).metadata.num_row_groups
            for start in range(0, groups, 3):
                inputs.append(pq.ParquetFile(corpus).read_row_groups(list(range(start, min(start + 3, groups)))))
        mine = [r for r in records if r.group == split]
        assert len(mine) == len(inputs) == report.corpus[split].shards
        assert len(mine) > 1 or split == "validation"
        for index, (record, table) in enumerate(zip(mine, inputs, strict=True)):
            file = paths.pretrain_blocks / record.file
            assert record.file == f"{split}/part-{index:05d}.arrow" and record.sha256 == file_digest(file)
            shard = Dataset.from_file(str(file))
            rows = shard["input_ids"]
            assert record.rows == len(rows) and all(len(r) == 128 for r in rows[:-1])  # a shard ends its own block
            texts = table["text"].to_pylist()
            expected: list[int] = []
            for enc in raw_backend(tok).encode_batch(texts, add_special_tokens=False):
                expected += [*enc.ids, tok.sep_token_id]
            assert [t for r in rows for t in r[1:-1]] == expected[:-1]  # every token kept, in order
            assert record.tokens == len(expected) - len(texts)
        assert sum(r.tokens for r in mine) == report.corpus[split].tokens
    assert [r.group for r in records if r.group == "task_text"] == ["task_text"]


def test_open_group_concatenates_the_shards_in_order(sharded) -> None:
    paths, report = sharded
    train, sizes = open_group(paths.pretrain_blocks, "train")
    assert len(sizes) > 1 and sum(sizes) == len(train) == report.corpus["train"].blocks


def test_a_missing_shard_a_stale_or_broken_manifest_are_named(sharded, tmp_path: Path) -> None:
    paths, _ = sharded
    copy = tmp_path / "pretrain"
    shutil.copytree(paths.pretrain_blocks, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["shards"][0]["rows"] += 1  # a shard rewritten by hand, or a manifest from another run
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"manifest.json: \[stale-manifest\] '[a-z_]+' shards hold"):
        open_group(copy, manifest["shards"][0]["group"])
    shutil.copy(paths.pretrain_blocks / MANIFEST, copy / MANIFEST)
    (copy / "train" / "part-00001.arrow").unlink()
    with pytest.raises(MissingInput, match=r"part-00001.arrow.*listed in manifest.json but missing"):
        open_group(copy, "train")
    (copy / MANIFEST).write_text('{"shards": [{"group": "train"}]}')
    with pytest.raises(MissingInput, match="not a complete shard manifest"):
        open_group(copy, "train")


def test_a_block_shard_cut_edited_or_listed_outside_its_group_is_refused(sharded, tmp_path: Path) -> None:
    """Issue 61: a block shard cut in half was `internal error OSError` (exit 1, not retried); an edited one and an
    entry out of the folder were read. Each is now a DataError naming the file and the rule."""
    paths, _ = sharded
    copy = tmp_path / "pretrain"
    shutil.copytree(paths.pretrain_blocks, copy)
    shard = copy / "train" / "part-00000.arrow"
    original = shard.read_bytes()
    shard.write_bytes(original[: len(original) // 2])
    with pytest.raises(DataError, match=r"part-00000\.arrow: \[corrupt-blocks\] not a readable Arrow shard"):
        open_group(copy, "train")
    table = Dataset.from_file(str(paths.pretrain_blocks / "train" / "part-00000.arrow"))
    ids = table["input_ids"]
    edited = Dataset.from_dict(
        {**table.to_dict(), "input_ids": [list(reversed(ids[0])), *ids[1:]]}, features=table.features
    )
    shard.unlink()
    # a valid Arrow stream of the same rows with other tokens: what Dataset.from_file reads
    pa_table = edited.data.table
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, pa_table.schema) as writer:
        writer.write_table(pa_table)
    with pytest.raises(DataError, match=r"\[stale-manifest\] its SHA-256 is not the one manifest\.json records"):
        open_group(copy, "train")
    shard.write_bytes(original)
    manifest = json.loads((copy / MANIFEST).read_text())
    first = next(i for i, r in enumerate(manifest["shards"]) if r["group"] == "train")
    manifest["shards"][first]["file"] = "../../raw/outside.arrow"
    (copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"\[corrupt-manifest\] entry '\.\./\.\./raw/outside\.arrow' lies outside"):
        open_group(copy, "train")


def test_ingest_and_tokenize_on_ray_write_the_same_files_byte_for_byte(sharded, tmp_path: Path) -> None:
    """``ingest.engine: ray`` then ``tokenize.engine: ray``, each on a real local Ray started for the stage: the same
    corpus, shards, manifest and counts as the local engines'."""
    try:
        import ray  # noqa: F401
    except ImportError:
        environment_skip("Ray is not installed")
    local, local_report = sharded
    paths = Paths(tmp_path)
    shutil.copytree(local.demo, paths.demo)
    cfg = make_config(**SHARDED, **{"ingest.engine": "ray", "tokenize.engine": "ray", "ray.num_cpus": 2})
    ingest.run(cfg, paths)
    for split in ("train", "validation"):  # the same rows; `source` names the file under each project's root
        mine, theirs = (
            pa.concat_tables(pq.read_table(f) for f in corpus_files(p.corpus, split)) for p in (paths, local)
        )
        assert mine.drop(["source"]).equals(theirs.drop(["source"]))
        relocated = [s.replace(str(paths.root), str(local.root)) for s in mine["source"].to_pylist()]
        assert relocated == theirs["source"].to_pylist()
    validate.run(cfg, paths)
    report = tokenize.run(cfg, paths)
    assert report.engine == "ray" and report.engine_cluster is not None and report.engine_cluster["joined"] is False
    mine = sorted(p.relative_to(paths.pretrain_blocks) for p in paths.pretrain_blocks.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(local.pretrain_blocks) for p in local.pretrain_blocks.rglob("*") if p.is_file())
    assert mine == theirs and len(mine) > 4
    for rel in mine:
        assert (paths.pretrain_blocks / rel).read_bytes() == (local.pretrain_blocks / rel).read_bytes(), rel
    stable = check_json_seal(local.tokenize_report, json.loads(local.tokenize_report.read_text()))
    assert check_json_seal(paths.tokenize_report, json.loads(paths.tokenize_report.read_text())) == {
        **stable,
        "engine": "ray",
        "engine_cluster": report.engine_cluster,
    }
    assert report.corpus == local_report.corpus


@pytest.mark.slow
def test_streamed_pretraining_resumed_after_kill_9_is_bit_exact(sharded, tmp_path: Path) -> None:
    """Pretraining over several shards (and into a second epoch) killed with SIGKILL after a checkpoint, then run
    again: it resumes where the checkpoint's stream stood and ends with the uninterrupted run's weights, bit for bit."""
    import torch
    from safetensors.torch import load_file

    source, report = sharded
    paths = Paths(tmp_path / "project")
    for sub in ("data", "reports", "models/tokenizer"):
        shutil.copytree(source.root / sub, paths.root / sub)
    batch = 32
    steps = -(-2 * report.corpus["train"].blocks // batch)  # two epochs of 32 blocks per step
    settings = {
        **SHARDED,
        **TINY_PRETRAIN,
        "pretrain.micro_batch_size": batch,
        "pretrain.max_steps": steps,
        "pretrain.save_steps": 2,
        "pretrain.eval_steps": steps,
        "pretrain.save_total_limit": 50,
    }
    pretrain.run(make_config(**settings), paths)
    uninterrupted = load_file(paths.dapt / "model.safetensors")
    shutil.rmtree(paths.pretrain_checkpoints)
    shutil.rmtree(paths.dapt)

    params = write_params(tmp_path / "params.yaml", **settings)
    command = [sys.executable, "-m", "pipeline", "--params", str(params), "--root", str(paths.root), "pretrain"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    half = steps // 4 * 2  # a checkpoint step (every 2) in the middle of the run
    kill_after = paths.pretrain_checkpoints / f"checkpoint-{half + 2}"  # then checkpoint-{half} is complete
    while not kill_after.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the kill landed mid-run: the process died of it, before the final model was written
    assert proc.returncode == -signal.SIGKILL and not paths.dapt.exists()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from checkpoint-" in again.stdout
    resumed = read_report(
        paths.pretrain_report, PretrainReport
    ).resumed_from  # with its run-to-run half (reports/measured/)
    assert resumed is not None and int(resumed.split("-")[1]) >= half
    final = load_file(paths.dapt / "model.safetensors")
    assert all(torch.equal(final[k], uninterrupted[k]) for k in uninterrupted)
    # each checkpoint records where the stream stood: the shard and offset of the next block, in constant time
    _, sizes = open_group(paths.pretrain_blocks, "train")
    epochs = set()
    for folder in paths.pretrain_checkpoints.glob("checkpoint-*"):
        if not folder.name.removeprefix("checkpoint-").isdigit():
            continue  # checkpoint-N.corrupt: the one the kill landed in, set aside by the resume
        state = json.loads((folder / STREAM_STATE).read_text())
        step = int(folder.name.split("-")[1])
        point = BlockStream(sizes, batch, steps, seed=make_config().seed).point(step * batch)
        assert state == {**asdict(point), "seed": make_config().seed, "batch": batch}
        epochs.add(state["epoch"])
    assert len(sizes) >= 2 and {0, 1} <= epochs  # two shards or more, and checkpoints in the first and second epoch
