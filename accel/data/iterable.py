"""Sharding an iterable stream at the batch level, in the main process.

Every rank iterates the whole stream (so every rank knows how it ends) and keeps chunk
``i * world + rank`` of the collated chunks. Chunks that belong to other ranks are dropped at
once; only their sample counts are kept. Sharding after collation keeps DataLoader workers,
batched transfer from them and any worker sharding done by the dataset itself.

Example:
    >>> chunks = iter([("a", 2), ("b", 2), ("c", 1)])
    >>> rounds = ChunkRounds(chunks, world=2, rank=1, keep_padding=True)
    >>> [(s.payload, s.real) for s in rank_steps(rounds, rank=1, world=2, pad=rounds.pad)]
    [('b', 2), ('b', 0)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from .._base import tree as _tree
from .plan import Unit, rank_steps

__all__ = ["ChunkRounds", "CountingCollate", "IterableDatasetShard", "clone_batch", "count_samples",
           "rank_steps"]

_OTHER = object()  # stands for another rank's chunk, which this rank does not keep


def count_samples(batch: Any) -> int:
    """Number of samples in a collated batch: the first dimension of its first tensor."""
    leaves, _ = _tree.flatten(batch, strict=False)
    for leaf in leaves:
        if leaf.dim() >= 1:
            return int(leaf.shape[0])
    if isinstance(batch, (list, tuple)) and not leaves:
        return len(batch)
    return 1


class CountingCollate:
    """Wraps the user's collate_fn so each chunk carries its exact number of samples.

    Runs in the DataLoader workers; it is a module-level class so that it pickles.
    """

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, data: Any) -> tuple[Any, int]:
        batch = self.collate_fn(data)
        return batch, (len(data) if self.batched else count_samples(batch))


def clone_batch(batch: Any) -> Any:
    """A copy of ``batch`` whose tensors the user cannot change through the original."""
    return _tree.apply(lambda t: t.clone(), data=batch)


class ChunkRounds:
    """Iterates rounds of ``world`` chunks, keeping only this rank's payloads.

    ``keep_padding`` (even_batches) keeps what this rank needs to pad a final round in which it
    has no chunk: a copy of chunk ``rank mod total_chunks``, i.e. its own first chunk (cloned,
    the user may change it in place) or, when the whole stream has fewer chunks than ranks, the
    chunk that index points to. ``drop_below`` drops rounds with fewer samples (split_batches
    with drop_last: an incomplete final batch).
    """

    def __init__(self, chunks: Iterator[tuple[Any, int]], *, world: int, rank: int,
                 keep_padding: bool, drop_below: int | None = None) -> None:
        self.chunks = chunks
        self.world = world
        self.rank = rank
        self.keep_padding = keep_padding
        self.drop_below = drop_below
        self.first_round: list[Any] = []
        self.own_first: Unit | None = None
        self.rounds_read = 0

    def __iter__(self) -> Iterator[list[Unit]]:
        units: list[Unit] = []
        for index, (batch, count) in enumerate(self.chunks):
            slot = index % self.world
            if self.keep_padding and index < self.world:
                self._remember(slot, batch, count)
                if index == self.world - 1:
                    self.first_round = []  # round 0 is full: every rank has its own chunk
            units.append(Unit(batch if slot == self.rank else _OTHER, int(count)))
            if len(units) == self.world:
                yield from self._emit(units)
                units = []
        if units:
            yield from self._emit(units)

    def _emit(self, units: list[Unit]) -> Iterator[list[Unit]]:
        self.rounds_read += 1
        if self.drop_below is not None and sum(u.size for u in units) < self.drop_below:
            return
        yield units

    def _remember(self, slot: int, batch: Any, count: int) -> None:
        if slot == self.rank:
            self.own_first = Unit(clone_batch(batch), int(count))
        elif slot < self.rank:  # may be needed if the stream has at most `rank` chunks
            self.first_round.append(Unit(batch, int(count)))

    def pad(self, units: list[Unit], *, final: bool) -> list[tuple[Unit, int]]:
        """even_batches padder: ranks without a chunk in the final round get a duplicate."""
        slots = [(unit, unit.size) for unit in units]
        if len(units) == self.world:
            return slots
        duplicate = self.own_first
        if duplicate is None:  # the whole stream was one partial round without this rank
            duplicate = self.first_round[self.rank % len(units)]
        slots.extend((duplicate, 0) for _ in range(self.world - len(units)))
        return slots



class IterableDatasetShard(IterableDataset[Any]):
    """The samples of ``dataset`` that process ``process_index`` of ``num_processes`` takes
    (Accelerate's class and arguments): a dataset to put in a ``DataLoader``, sharded at the
    sample level (a prepared loader shards batches itself and never makes one).

    The stream is read in groups of ``batch_size * num_processes`` samples (``batch_size``
    with ``split_batches``) and this process keeps its contiguous ``batch_size`` (or
    ``batch_size // num_processes``) of each group. A final partial group is dropped with
    ``drop_last``, else completed by repeating the stream's first group, so that every process
    yields as many samples. ``set_epoch`` is passed on to the dataset.

    Example:
        >>> [list(IterableDatasetShard(range(5), batch_size=2, num_processes=2,
        ...                            process_index=r)) for r in range(2)]
        [[0, 1, 4, 0], [2, 3, 1, 2]]
    """

    def __init__(self, dataset: Iterable[Any], batch_size: int = 1, drop_last: bool = False,
                 num_processes: int = 1, process_index: int = 0,
                 split_batches: bool = False) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes:
            raise ValueError(
                f"IterableDatasetShard(split_batches=True) splits each batch across "
                f"{num_processes} processes: batch_size={batch_size} must be a round multiple "
                f"of {num_processes}; change batch_size or pass split_batches=False")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.num_processes = int(num_processes)
        self.process_index = int(process_index)
        self.split_batches = bool(split_batches)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def _sizes(self) -> tuple[int, int]:
        """(samples per group, this process's samples per group)."""
        if self.split_batches:
            return self.batch_size, self.batch_size // self.num_processes
        return self.batch_size * self.num_processes, self.batch_size

    def __len__(self) -> int:
        group, own = self._sizes()
        total = len(self.dataset)  # type: ignore[arg-type]  # TypeError when unsized
        groups = total // group if self.drop_last else -(-total // group)
        return groups * own

    def __iter__(self) -> Iterator[Any]:
        group_size, own = self._sizes()
        start = self.process_index * own
        first: list[Any] | None = None
        group: list[Any] = []
        for sample in self.dataset:
            group.append(sample)
            if len(group) == group_size:
                yield from group[start:start + own]
                first = group if first is None else first
                group = []
        if group and not self.drop_last:
            filler = first if first is not None else list(group)
            while len(group) < group_size:
                group.extend(filler[:group_size - len(group)])
            yield from group[start:start + own]
