"""The order pretraining reads its blocks in: shard by shard, seeded, and a jump to any position in constant time.

Data epoch ``e`` visits the shards in a seeded order and, within a shard, its rows in a seeded order: the one
permutation held at a time is a shard's, never the corpus's, so memory is bounded by the shard size. Global batches
of ``batch`` rows are cut from the endless sequence epoch 0, epoch 1, ...; under torchrun accelerate deals global
batch ``i`` to rank ``i mod world``, so each rank reads its own batches. The Trainer sees one epoch holding exactly
the batches its ``max_steps`` need.

Resuming does not replay the batches already trained on (the Trainer's own resume walks its sampler through every
one of them: hours on a large corpus, transformers #11284): the stream starts at batch ``global_step x
gradient_accumulation x world``, found by a division (the epoch), a search of the shards' cumulative sizes (the
shard) and a subtraction (the offset); only that shard is then permuted. Each checkpoint records where its stream
stands (``stream.json``: epoch, shard, offset) next to the Trainer's RNG state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

STREAM_STATE = "stream.json"  # in each checkpoint folder


@dataclass(frozen=True)
class StreamPoint:
    """Where the stream stands before row ``position``: data epoch, shard (an index into the shard list), the
    offset of the next row within that shard's seeded order."""

    position: int  # rows read before this point (all ranks together)
    epoch: int
    shard: int
    offset: int


class BlockStream:
    """A batch sampler over shards of ``sizes`` rows (in dataset order): seeded per epoch and shard, ``batches``
    global batches long, starting at batch ``start``; ``on_epoch`` hears each batch's data epoch before it is read."""

    def __init__(
        self,
        sizes: list[int],
        batch: int,
        batches: int,
        seed: int,
        on_epoch: Callable[[int], None] | None = None,
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])  # a shard's first row in the dataset
        self.total = int(self.offsets[-1])
        if self.total == 0:
            raise ValueError("a block stream needs at least one block")
        self.batch, self.batches, self.seed = batch, batches, seed
        self.on_epoch = on_epoch
        self.start = 0  # the first global batch to yield (a resumed run's)

    def __len__(self) -> int:
        return self.batches

    def shard_order(self, epoch: int) -> np.ndarray:
        """The shards in the order epoch ``epoch`` reads them."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.sizes))

    def shard_rows(self, epoch: int, shard: int) -> np.ndarray:
        """Shard ``shard``'s dataset rows in the order epoch ``epoch`` reads them."""
        order = np.random.default_rng([self.seed, epoch, shard]).permutation(int(self.sizes[shard]))
        return order + self.offsets[shard]

    def point(self, position: int) -> StreamPoint:
        """Where the stream stands before row ``position``, without reading anything before it."""
        epoch, rest = divmod(position, self.total)
        order = self.shard_order(epoch)
        ends = np.cumsum(self.sizes[order])
        k = int(np.searchsorted(ends, rest, side="right"))  # the first shard of the order that ends after ``rest``
        return StreamPoint(position, epoch, int(order[k]), int(rest - (ends[k - 1] if k else 0)))

    def rows_from(self, position: int) -> Iterator[tuple[int, np.ndarray]]:
        """Endless (epoch, dataset rows) chunks from row ``position`` on, one shard's rows at a time."""
        at = self.point(position)
        epoch, offset = at.epoch, at.offset
        order = list(self.shard_order(epoch))
        k = order.index(at.shard)
        while True:
            for shard in order[k:]:
                rows = self.shard_rows(epoch, int(shard))[offset:]
                offset = 0
                if len(rows):
                    yield epoch, rows
            epoch, k = epoch + 1, 0
            order = list(self.shard_order(epoch))

    def __iter__(self) -> Iterator[list[int]]:
        chunks = self.rows_from(self.start * self.batch)
        epoch, rows = 0, np.empty(0, dtype=np.int64)
        for _ in range(self.start, self.batches):
            parts: list[np.ndarray] = []
            need = self.batch
            while need:
                if not len(rows):
                    epoch, rows = next(chunks)
                if not parts:
                    batch_epoch = epoch  # a batch's epoch is its first row's
                parts.append(rows[:need])
                need -= len(parts[-1])
                rows = rows[len(parts[-1]) :]
            if self.on_epoch is not None:
                self.on_epoch(batch_epoch)
            yield np.concatenate(parts).tolist()


def write_stream_state(folder: Path, stream: BlockStream, batches_done: int) -> None:
    """Record in a checkpoint folder where the stream stands after ``batches_done`` global batches."""
    state = {**asdict(stream.point(batches_done * stream.batch)), "seed": stream.seed, "batch": stream.batch}
    (folder / STREAM_STATE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")


def read_stream_state(folder: Path) -> dict[str, int] | None:
    """A checkpoint's recorded stream position (``None`` for a checkpoint written before it was recorded)."""
    path = folder / STREAM_STATE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    return state if isinstance(state, dict) else None
