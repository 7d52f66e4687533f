"""Global batches, drawn the same way whatever the layout, each rank taking its shard.

Every layout sees the same sequence of global batches for a seed: data-parallel rank r of n takes
the r-th slice of each, the single process takes the whole. That makes a parallel run's loss series
comparable, step for step, with the single-process run of the same global batch.
"""

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class ShardedBatchSampler(Sampler[list[int]]):
    def __init__(
        self,
        n_samples: int,
        global_batch: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        start: int = 0,
    ) -> None:
        if global_batch % world:
            raise ValueError(f"global batch {global_batch} does not split into {world} shards")
        self.n_samples, self.global_batch = n_samples, global_batch
        self.shuffle, self.seed = shuffle, seed
        self.shard = global_batch // world
        self.offset = rank * self.shard
        self.epoch = 0
        self.start = start  # global batches already trained on (a resumed run goes on from there)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning before each epoch: a new order per epoch, the same on every rank."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n_samples // self.global_batch  # the last partial batch is dropped

    def __iter__(self) -> Iterator[list[int]]:
        # A resumed run's epochs count on from the snapshot's: the same order, batch for batch.
        epoch = self.epoch + self.start // len(self)
        skip = self.start % len(self) if self.epoch == 0 else 0
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.n_samples, generator=generator)
        else:
            order = torch.arange(self.n_samples)
        for start in range(
            skip * self.global_batch, len(self) * self.global_batch, self.global_batch
        ):
            first = start + self.offset
            yield order[first : first + self.shard].tolist()
