"""The block stream pretraining reads: every row once per epoch, shard by shard, and a resume that jumps to any
position in constant time with exactly the batches the uninterrupted stream yields from there."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import DataError
from pipeline.training.stream import BlockStream, write_stream_state


def batches(stream: BlockStream, start: int = 0) -> list[list[int]]:
    stream.start = start
    return list(stream)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=6).filter(lambda s: sum(s) > 0),
    batch=st.integers(1, 5),
    length=st.integers(1, 40),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_a_resumed_stream_yields_what_the_uninterrupted_one_yields_from_there(
    sizes: list[int], batch: int, length: int, seed: int, data: st.DataObject
) -> None:
    whole = batches(BlockStream(sizes, batch, length, seed))
    start = data.draw(st.integers(0, length))
    assert batches(BlockStream(sizes, batch, length, seed), start) == whole[start:]
    assert len(whole) == length and all(len(b) == batch for b in whole)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6).filter(lambda s: sum(s) > 0), seed=st.integers(0, 9))
def test_each_epoch_reads_every_row_once_one_shard_at_a_time(sizes: list[int], seed: int) -> None:
    total = sum(sizes)
    epochs: list[int] = []
    stream = BlockStream(sizes, 1, 3 * total, seed, on_epoch=epochs.append)
    rows = [b[0] for b in stream]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shard_of = np.searchsorted(offsets, rows, side="right") - 1
    for e in range(3):
        epoch_rows = rows[e * total : (e + 1) * total]
        assert sorted(epoch_rows) == list(range(total))  # every row exactly once
        shards = shard_of[e * total : (e + 1) * total]
        runs = [s for i, s in enumerate(shards) if i == 0 or s != shards[i - 1]]
        assert len(runs) == len(set(runs))  # a shard is read in one run, never revisited within the epoch
    assert epochs == [e for e in range(3) for _ in range(total)]  # the collator hears each batch's data epoch


def test_epochs_and_seeds_change_the_order() -> None:
    one = batches(BlockStream([50, 50], 10, 20, seed=1))
    assert one[:10] != one[10:] and one != batches(BlockStream([50, 50], 10, 20, seed=2))


def test_the_jump_to_a_position_does_not_read_what_comes_before() -> None:
    """A corpus of 10^12 blocks in 10^6 shards: resuming at its middle costs one shard's permutation."""
    sizes = [1_000_000] * 1_000_000
    stream = BlockStream(sizes, 32, 10**11, seed=0)
    start = time.perf_counter()
    stream.start = 15 * 10**9  # batch 1.5e10: row 4.8e11, epoch 0, somewhere in the middle of the shard order
    first = next(iter(stream))
    assert time.perf_counter() - start < 5.0  # one shard's permutation plus a sort of 10^6 shard ids
    point = stream.point(stream.start * 32)
    assert point.epoch == 0 and 0 <= point.offset < 1_000_000
    assert first[0] == stream.shard_rows(0, point.shard)[point.offset]


def test_resume_starts_at_the_checkpoint_and_refuses_one_whose_recorded_point_disagrees(tmp_path: Path) -> None:
    from pipeline.training.pretraining.trainer import PretrainTrainer

    trainer = object.__new__(PretrainTrainer)  # resume_stream reads only these two attributes
    trainer.args = SimpleNamespace(gradient_accumulation_steps=2, world_size=1)
    trainer.stream = BlockStream([10, 7], 4, 100, seed=3)
    write_stream_state(tmp_path, trainer.stream, 6)  # written after 3 optimiser steps of 2 batches
    trainer.resume_stream(tmp_path, 3)
    assert trainer.stream.start == 6
    with pytest.raises(DataError, match=r"stream.json: \[stale-checkpoint\] it records the stream at row 24"):
        trainer.resume_stream(tmp_path, 4)
