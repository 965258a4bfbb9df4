"""``hvd.elastic.ElasticSampler``: shards a dataset over the workers and, after a reset, only
the samples not yet processed this epoch (Horovod v0.28's semantics, plus ``record_indices``).

The epoch's order is a seeded shuffle of the whole dataset, the same on every rank. Progress is
kept in two ways: ``record_batch(batch_idx, batch_size)`` counts samples processed by all ranks
together (``batch_size * num_replicas`` per call, Horovod v0.28), so the first
``processed_num`` samples of the epoch's order are done; ``record_indices(indices)`` (Horovod's
older API) marks this rank's own indices, and a sync unites every rank's. After a reset, the
remaining samples are split again over the (possibly different) number of workers.

Example:
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    >>> sampler.record_batch(0, 4)
    >>> sampler.load_state_dict(sampler.state_dict())  # what a reset does
    >>> list(sampler)
    [4, 5, 6, 7, 8, 9]
    >>> sampler.record_indices([4, 5]); sampler.reset(); list(sampler)
    [6, 7, 8, 9]
    >>> hvd.shutdown()
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sized
from typing import Any

from torch.utils.data import Sampler

from ..basics import rank, size

__all__ = ["ElasticSampler"]


class ElasticSampler(Sampler[int]):
    """Partition ``dataset`` over the workers, skipping samples processed this epoch.

    Use it as Horovod's: put it in the ``TorchState``, call ``record_batch`` after each batch
    (or ``record_indices``), and ``set_epoch`` at the *end* of each epoch (it clears the
    processed samples).

    Args:
        dataset: the dataset (a constant length).
        shuffle: shuffle the order of each epoch (seeded with ``seed + epoch``).
        seed: the shuffling seed, the same on every rank.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.processed_indices: set[int] = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order, nothing processed (call it at the epoch's end)."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record one more batch of ``batch_size`` samples on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices: Iterable[int]) -> None:
        """Record this rank's ``indices`` as processed (a sync unites every rank's)."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch ``batch_idx`` in the current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num,
                "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict.get("processed_num", 0))
        self.processed_indices = {int(i) for i in state_dict.get("processed_indices", ())}
        self.reset()

    def reset(self) -> None:
        """Split the samples not processed yet over the current workers."""
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order[self.processed_num:]
                                  if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = self.remaining_indices[:]
        # pad by repeating from the start so that every rank gets num_samples
        while indices and len(indices) < self.total_size:
            indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
