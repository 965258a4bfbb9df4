"""Samplers for prepared map-style loaders: seeded shuffling, the rank shard, skipping.

Example:
    >>> from torch.utils.data import RandomSampler
    >>> sampler = SeedableSampler(RandomSampler(range(5)), seed=3)
    >>> sampler.set_epoch(1)
    >>> order = list(sampler)
    >>> order == list(sampler) and sorted(order) == [0, 1, 2, 3, 4]
    True
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Sampler

from .plan import IndexPadder, Step, index_rounds, rank_steps

__all__ = ["EpochRun", "SeedableSampler", "ShardBatchSampler", "SkipBatchSampler", "epoch_seed"]

_MASK = (1 << 63) - 1


def epoch_seed(seed: int, epoch: int) -> int:
    """A generator seed that depends only on ``(seed, epoch)`` (mixed, so nearby seeds differ)."""
    value = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK
    value ^= value >> 31
    return (value * 0xD6E8FEB86659FD93) & _MASK


class SeedableSampler(Sampler[int]):
    """Wraps a sampler that draws from ``self.generator`` (``RandomSampler``,
    ``SubsetRandomSampler``, ``WeightedRandomSampler``) so that each epoch's order depends only
    on ``(seed, epoch)``: every rank computes the same order, and a resumed run the same one.
    """

    def __init__(self, sampler: Sampler[int], seed: int) -> None:
        self.sampler = sampler
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        inner = copy.copy(self.sampler)
        generator = torch.Generator()
        generator.manual_seed(epoch_seed(self.seed, self.epoch))
        inner.generator = generator  # type: ignore[attr-defined]
        return iter(inner)

    def __len__(self) -> int:
        # Sampler declares no __len__: len() raises TypeError for an unsized one, as wanted.
        return len(self.sampler)  # type: ignore[arg-type]


@dataclass
class EpochRun:
    """One pass over a prepared map-style loader: its epoch, batches to skip, and the steps the
    shard sampler has planned (read in order by the prepared loader as batches arrive)."""

    epoch: int
    skip: int = 0
    steps: deque[Step] = field(default_factory=deque)


class ShardBatchSampler(Sampler[Any]):
    """Yields this rank's index batches (see ``plan``) and records each step's bookkeeping.

    With ``singles`` (the user's loader had ``batch_size=None`` and a sampler of single indices)
    it yields single indices and must be passed as ``sampler=``; otherwise it yields index lists,
    for ``batch_sampler=`` (or for ``sampler=`` with ``batch_size=None`` when the user passed a
    ``BatchSampler`` as the sampler: each list is then fetched as ``dataset[indices]``).
    """

    def __init__(self, batches: Iterable[list[int]], *, rank: int, world: int, even: bool,
                 split_size: int | None, unit_size: int | None, singles: bool = False) -> None:
        self.batches = batches
        self.rank = rank
        self.world = world
        self.even = even
        self.split_size = split_size
        self.unit_size = split_size if split_size is not None else unit_size
        self.singles = singles
        self.next_run: EpochRun | None = None

    def __iter__(self) -> Iterator[Any]:
        # Not a generator function: the run is taken now, when the DataLoader starts a pass.
        # It is not cleared: a DataLoader iterator may call iter() twice while starting (and
        # iterate only the second); the prepared loader sets a new run before every pass.
        run = self.next_run or EpochRun(epoch=0)
        return self._generate(run)

    def steps(self, skip: int = 0) -> Iterator[Step]:
        """This rank's steps for one pass over ``self.batches`` (used by tests and ``__iter__``)."""
        padder = IndexPadder(self.world, self.unit_size) if self.even else None
        rounds = index_rounds(self.batches, world=self.world, split_size=self.split_size,
                              record=padder.record if padder is not None else None)
        return rank_steps(rounds, rank=self.rank, world=self.world, pad=padder, skip=skip)

    def _generate(self, run: EpochRun) -> Iterator[Any]:
        for step in self.steps(run.skip):
            run.steps.append(step)
            if step.payload is not None:
                yield step.payload[0] if self.singles else step.payload

    # -- lengths -------------------------------------------------------------------------------
    def num_rounds(self) -> int:
        """Rounds per epoch (the same on every rank); ``TypeError`` when the length is unknown."""
        n = len(self.batches)  # type: ignore[arg-type]  # TypeError when unsized, as documented
        return n if self.split_size is not None else -(-n // self.world)

    def __len__(self) -> int:
        n = len(self.batches)  # type: ignore[arg-type]  # TypeError when unsized, as for torch
        if self.even or self.world == 1:
            return self.num_rounds()
        if self.split_size is None:
            return n // self.world + (self.rank < n % self.world)
        last = _last_batch_size(self.batches, n)
        if n == 0 or last is None:
            return n
        return n - 1 + (self.rank * self.split_size < last)


def _last_batch_size(batches: Iterable[list[int]], n: int) -> int | None:
    """Size of a standard ``BatchSampler``'s last batch, or None when it cannot be known."""
    sampler = getattr(batches, "sampler", None)
    size = getattr(batches, "batch_size", None)
    if not isinstance(size, int) or not isinstance(sampler, Sized) or n == 0:
        return None
    if getattr(batches, "drop_last", False):
        return size
    return len(sampler) - (n - 1) * size


class SkipBatchSampler(Sampler[Any]):
    """A batch sampler (or sampler) that leaves out the first ``skip`` items of every pass."""

    def __init__(self, sampler: Iterable[Any], skip: int) -> None:
        self.sampler = sampler
        self.skip = int(skip)

    def __iter__(self) -> Iterator[Any]:
        for index, item in enumerate(self.sampler):
            if index >= self.skip:
                yield item

    def __len__(self) -> int:
        # TypeError for an unsized sampler, as DataLoader's own len() gives.
        return max(0, len(self.sampler) - self.skip)  # type: ignore[arg-type]
