"""Samplers: an infinite, seeded, per-rank training stream and a disjoint per-rank eval shard."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from yolox_fast.utils import dist as dist_utils


class InfiniteSampler(Sampler):
    """Endless training indices for one rank.

    Pass p is a permutation seeded by (seed, p) (or 0..N-1 without shuffle); rank r takes
    perm[r::world][:N // world], so within a pass the ranks' shards are disjoint and equally long, and
    the shards change every pass. Position k of a rank's stream is pass k // (N // world), so any
    point of the stream can be resumed without replaying it.
    """

    def __init__(
        self,
        size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.size = size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = dist_utils.get_rank() if rank is None else rank
        self.world_size = dist_utils.get_world_size() if world_size is None else world_size
        self.per_rank = size // self.world_size
        if self.per_rank == 0:
            raise ValueError(f"{size} training images cannot be split over {self.world_size} ranks")

    def _shard(self, epoch_pass: int) -> np.ndarray:
        order = (
            np.random.default_rng([self.seed, epoch_pass]).permutation(self.size)
            if self.shuffle
            else np.arange(self.size)
        )
        return order[self.rank :: self.world_size][: self.per_rank]

    def indices_from(self, position: int = 0) -> Iterator[tuple[int, int]]:
        """(position, dataset index) pairs of this rank's stream from `position` on, forever."""
        epoch_pass, offset = divmod(position, self.per_rank)
        while True:
            for index in self._shard(epoch_pass)[offset:]:
                yield position, int(index)
                position += 1
            epoch_pass, offset = epoch_pass + 1, 0

    def __iter__(self) -> Iterator[int]:
        return (index for _, index in self.indices_from(0))

    def __len__(self) -> int:
        return self.per_rank


class YoloBatchSampler(Sampler):
    """Batches of loader items (mosaic flag, index, seed words) from an InfiniteSampler.

    The mosaic flag is read when each batch is formed (in the main process), so `mosaic = False`
    reaches persistent workers. Seed words (seed, rank, position) make each sample's augmentation a
    function of its stream position alone: the same with any number of workers, cached or not.
    `start_batch` resumes the stream (TrainLoader uses it to restart cleanly on close_mosaic).
    """

    def __init__(self, sampler: InfiniteSampler, batch_size: int, mosaic: bool = True) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.mosaic = mosaic
        self.start_batch = 0

    def __iter__(self) -> Iterator[list[tuple[bool, int, tuple[int, int, int]]]]:
        batch = []
        for position, index in self.sampler.indices_from(self.start_batch * self.batch_size):
            batch.append((self.mosaic, index, (self.sampler.seed, self.sampler.rank, position)))
            if len(batch) == self.batch_size:
                yield batch
                batch = []

    def __len__(self) -> int:
        """Iterations per epoch on this rank (at least 1)."""
        return max(1, len(self.sampler) // self.batch_size)


class ShardSampler(Sampler):
    """Eval indices rank::world: disjoint shards covering the split exactly once, no padding duplicates."""

    def __init__(self, size: int, rank: int | None = None, world_size: int | None = None) -> None:
        self.size = size
        self.rank = dist_utils.get_rank() if rank is None else rank
        self.world_size = dist_utils.get_world_size() if world_size is None else world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.size, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world_size))
