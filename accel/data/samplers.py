"""Samplers for prepared map-style loaders: seeded shuffling, the rank shard, skipping.

With ``use_seedable_sampler=True`` shuffling follows Accelerate's ``SeedableRandomSampler``:
the order of epoch ``e`` is what the wrapped sampler draws from a generator seeded with
``seed + e``, so that every rank computes the same order, a resumed run the same one, and a
script run with Accelerate and the same seed sees the same order under accel. (By default the
user's sampler is kept and draws from its own generator; see ``PreparedDataLoader``.)

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
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import RandomSampler, Sampler

from .plan import IndexPadder, Step, index_rounds, rank_steps

__all__ = ["BatchSamplerShard", "EpochRun", "SeedableRandomSampler", "SeedableSampler",
           "SkipBatchSampler", "epoch_seed"]

_MASK = (1 << 63) - 1


def epoch_seed(seed: int, epoch: int) -> int:
    """A generator seed that depends only on ``(seed, epoch)`` (mixed, so nearby seeds differ)."""
    value = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK
    value ^= value >> 31
    return (value * 0xD6E8FEB86659FD93) & _MASK


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order in epoch ``e`` is drawn from the seed ``initial_seed + e``
    (Accelerate's class of this name, same arguments and orders).

    ``data_seed`` defaults to ``torch.initial_seed()``. A finished pass moves on to the next
    epoch; ``set_epoch`` chooses one. ``prepare()`` puts one in place of a ``RandomSampler``.

    Example:
        >>> a = SeedableRandomSampler(range(6), data_seed=4)
        >>> first, second = list(a), list(a)
        >>> a.set_epoch(0)
        >>> list(a) == first != second
        True
    """

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = int(torch.initial_seed() if data_seed is None else data_seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.epoch += 1


class SeedableSampler(Sampler[int]):
    """Wraps another sampler that draws from ``self.generator`` (``SubsetRandomSampler``,
    ``WeightedRandomSampler``, a ``RandomSampler`` subclass) so that its order in epoch ``e``
    is drawn from the seed ``seed + e``, as ``SeedableRandomSampler``'s is.
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
        generator.manual_seed(self.seed + self.epoch)
        inner.generator = generator  # type: ignore[attr-defined]
        return iter(inner)

    def __len__(self) -> int:
        # Sampler declares no __len__: len() raises TypeError for an unsized one, as wanted.
        return len(self.sampler)  # type: ignore[arg-type]


@dataclass(kw_only=True, slots=True)
class EpochRun:
    """One pass over a prepared map-style loader: its epoch, batches to skip, and the steps the
    shard sampler has planned (read in order by the prepared loader as batches arrive)."""

    epoch: int
    skip: int = 0
    steps: deque[Step] = field(default_factory=deque)


class BatchSamplerShard(Sampler[Any]):
    """The batches of ``batch_sampler`` that process ``process_index`` of ``num_processes``
    takes (Accelerate's class, arguments and attribute names; what ``prepare()`` puts in a
    map-style loader, so a prepared loader's ``batch_sampler`` is one).

    Without ``split_batches`` process ``r`` takes batches ``r, r + n, r + 2n, ...``; with it,
    piece ``r`` of every batch. ``even_batches`` (settable: ``join_uneven_inputs`` overrides
    it) completes the last round by cycling from the first samples (from the first batches when
    the batch sampler has no ``batch_size``: batches of varying size), as Accelerate does. Unlike
    Accelerate's, ``drop_last=True`` on the batch sampler drops only its own short batch,
    never a round of full batches. See :mod:`accel.data.plan` for the rules.

    ``singles`` (accel's own): the loader had ``batch_size=None`` and ``batch_sampler`` yields
    one-index lists; the shard then yields single indices and goes in as ``sampler=``.
    Iterated by a prepared loader, each step's bookkeeping is recorded in ``next_run``.

    Example:
        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> batches = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)
        >>> list(BatchSamplerShard(batches, num_processes=2, process_index=1))
        [[3, 4, 5], [9, 0, 1]]
        >>> list(BatchSamplerShard(batches, num_processes=3, process_index=1,
        ...                        even_batches=False))
        [[3, 4, 5]]
    """

    def __init__(self, batch_sampler: Iterable[list[int]], num_processes: int = 1,
                 process_index: int = 0, split_batches: bool = False,
                 even_batches: bool = True, *, singles: bool = False) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False))
        self.split_size: int | None = None
        if split_batches:
            if not isinstance(self.batch_size, int) or self.batch_size % self.num_processes:
                raise ValueError(
                    f"split_batches=True splits each batch across {num_processes} processes, "
                    f"so batch_size must be a round multiple of {num_processes}; got batch_size="
                    f"{self.batch_size}. Use a batch size divisible by {num_processes} or "
                    "split_batches=False")
            self.split_size = self.batch_size // self.num_processes
        self.unit_size = self.split_size if split_batches else self.batch_size
        self.even = bool(even_batches) and self.num_processes > 1
        self.singles = singles
        self.next_run: EpochRun | None = None

    @property
    def rank(self) -> int:
        return self.process_index

    @property
    def world(self) -> int:
        return self.num_processes

    @property
    def split_batches(self) -> bool:
        return self.split_size is not None

    @property
    def even_batches(self) -> bool:
        return self.even

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.even = bool(value) and self.world > 1  # one process has nothing to even out

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]  # TypeError when unsized

    def __iter__(self) -> Iterator[Any]:
        # Not a generator function: the run is taken now, when the DataLoader starts a pass.
        # It is not cleared: a DataLoader iterator may call iter() twice while starting (and
        # iterate only the second); the prepared loader sets a new run before every pass. A
        # shard iterated on its own (no run set) records nothing.
        return self._generate(self.next_run)

    def steps(self, skip: int = 0) -> Iterator[Step]:
        """This rank's steps for one pass over ``batch_sampler`` (used by tests and iteration)."""
        padder = IndexPadder(self.world, self.unit_size) if self.even else None
        rounds = index_rounds(self.batch_sampler, world=self.world, split_size=self.split_size,
                              record=padder.record if padder is not None else None)
        return rank_steps(rounds, rank=self.rank, world=self.world, pad=padder, skip=skip)

    def _generate(self, run: EpochRun | None) -> Iterator[Any]:
        for step in self.steps(run.skip if run is not None else 0):
            if run is not None:
                run.steps.append(step)
            if step.payload is not None:
                yield step.payload[0] if self.singles else step.payload

    # -- lengths -------------------------------------------------------------------------------
    def num_rounds(self) -> int:
        """Rounds per epoch (the same on every rank); ``TypeError`` when the length is unknown."""
        n = len(self.batch_sampler)  # type: ignore[arg-type]  # TypeError when unsized
        return n if self.split_size is not None else -(-n // self.world)

    def __len__(self) -> int:
        n = len(self.batch_sampler)  # type: ignore[arg-type]  # TypeError when unsized
        if self.even or self.world == 1:
            return self.num_rounds()
        if self.split_size is None:
            return n // self.world + (self.rank < n % self.world)
        last = _last_batch_size(self.batch_sampler, n)
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
    """A batch sampler (or sampler) that leaves out the first ``skip_batches`` items of every
    pass (Accelerate's class of this name; ``batch_sampler`` is the wrapped one).

    Example:
        >>> list(SkipBatchSampler([[0, 1], [2, 3], [4]], skip_batches=1))
        [[2, 3], [4]]
    """

    def __init__(self, batch_sampler: Iterable[Any], skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = int(skip_batches)

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batch_sampler), self.skip_batches, None)

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]  # TypeError when unsized

    def __len__(self) -> int:
        # TypeError for an unsized sampler, as DataLoader's own len() gives.
        return max(0, len(self.batch_sampler) - self.skip_batches)  # type: ignore[arg-type]
