"""Where a prepared loader's batches come from: one class per kind of input loader.

``MapSource`` shards a map-style loader through its batch sampler (only this rank's samples
are loaded), ``IterableSource`` shards an iterable stream at the batch level in the main
process, and ``PassthroughSource`` leaves an already rank-sharded loader alone. Each yields
``(batch, Step)`` pairs for one pass.

Example:
    >>> from torch.utils.data import DataLoader
    >>> source = MapSource(DataLoader(range(5), batch_size=2), rank=0, world=1, even=True,
    ...                    split=False, seed=0)
    >>> [batch.tolist() for batch, step in source.steps(epoch=0, skip=0)]
    [[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from .._base.warn import warn_user
from .iterable import ChunkRounds, CountingCollate, count_samples
from .local import RankLocal
from .plan import Step, rank_steps
from .samplers import (
    BatchSamplerShard,
    EpochRun,
    SeedableRandomSampler,
    SeedableSampler,
    epoch_seed,
)

__all__ = ["DispatchSource", "MapSource", "IterableSource", "PassthroughSource",
           "find_distributed_sampler", "given_batch_sampler", "rebuild_loader"]

Pair = tuple[Any, Step]


def rebuild_loader(loader: DataLoader[Any], *, in_order: bool | None = None,
                   **overrides: Any) -> DataLoader[Any]:
    """A new ``DataLoader`` over ``loader.dataset`` with the same settings except ``overrides``
    (sampling arguments) and ``in_order`` (``None`` keeps the user's)."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers, "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory, "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator, "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    user_in_order = getattr(loader, "in_order", True)
    if in_order is not None and in_order != user_in_order:
        warn_user("DataLoader(in_order=False) is overridden: accel needs batches in sampler "
                  "order to know which samples each batch holds")
    kwargs["in_order"] = user_in_order if in_order is None else in_order
    kwargs.update(overrides)
    return DataLoader(loader.dataset, **kwargs)


def given_batch_sampler(loader: DataLoader[Any]) -> Any:
    """The loader's batch sampler: ``batch_sampler=``, or a ``BatchSampler`` passed as
    ``sampler=`` with ``batch_size=None`` (each of its items, a list of indices, is one batch
    fetched as ``dataset[indices]``); ``None`` when the sampler yields single indices."""
    if loader.batch_sampler is not None:
        return loader.batch_sampler
    return loader.sampler if isinstance(loader.sampler, BatchSampler) else None


def _samplers(loader: DataLoader[Any]) -> tuple[Any, ...]:
    """The loader's sampler and the sampler inside its batch sampler (or ``None``)."""
    return loader.sampler, getattr(given_batch_sampler(loader), "sampler", None)


def find_distributed_sampler(loader: DataLoader[Any]) -> DistributedSampler[Any] | None:
    for sampler in _samplers(loader):
        if isinstance(sampler, DistributedSampler):
            return sampler
    return None


def _warn_generators(loader: DataLoader[Any]) -> None:
    samplers = _samplers(loader)
    owned = [g for g in [loader.generator] + [getattr(s, "generator", None) for s in samplers
                                              if not hasattr(s, "set_epoch")] if g is not None]
    if owned:
        warn_user(
            "the DataLoader's (or its sampler's) generator is not used: the data order and the "
            "workers' seeds come from (seed, epoch), so that every rank shuffles the same way and "
            "a resumed run repeats them; set DataLoaderConfiguration(data_seed=...) to choose "
            "the seed")


def _seedable(sampler: Any, seed: int) -> Any:
    """A sampler drawing from a generator, made to draw epoch ``e``'s order from ``seed + e``
    (a plain ``RandomSampler`` becomes a ``SeedableRandomSampler``, as in Accelerate)."""
    if not hasattr(sampler, "generator") or hasattr(sampler, "set_epoch"):
        return sampler
    if type(sampler) is RandomSampler:
        return SeedableRandomSampler(sampler.data_source, replacement=sampler.replacement,
                                     num_samples=sampler._num_samples,
                                     generator=torch.Generator(), data_seed=seed)
    return SeedableSampler(sampler, seed)


def _pass_generator(sampler: Any) -> torch.Generator | None:
    """The generator ``sampler`` draws its order from, as Accelerate finds it when it keeps the
    user's sampler (``use_seedable_sampler=False``): a sampler without one gets a new generator
    seeded from one draw of torch's global RNG, on every rank (rank 0's state is used)."""
    if sampler is None or not hasattr(sampler, "generator") or hasattr(sampler, "set_epoch"):
        return None
    if sampler.generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        sampler.generator = generator
    generator = sampler.generator
    return generator if isinstance(generator, torch.Generator) else None


def _same_sampling(loader: DataLoader[Any], generator: torch.Generator) -> DataLoader[Any]:
    """``loader`` rebuilt with the same sampling but ``generator`` for the worker seeds."""
    if isinstance(loader.dataset, IterableDataset):
        return rebuild_loader(loader, batch_size=loader.batch_size, drop_last=loader.drop_last,
                              generator=generator)
    if loader.batch_sampler is None or type(loader.batch_sampler) is BatchSampler:
        return rebuild_loader(loader, sampler=loader.sampler, batch_size=loader.batch_size,
                              drop_last=loader.drop_last, generator=generator)
    return rebuild_loader(loader, batch_sampler=loader.batch_sampler, generator=generator)


class _Singles:
    """A sampler of single indices seen as batches of one (loaders with batch_size=None)."""

    batch_size = 1

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        return ([index] for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


class _Source:
    batch_size: int | None
    total_batch_size: int | None
    loader: DataLoader[Any]
    epoch_targets: list[Any]

    def __init__(self, loader: DataLoader[Any], *, rank: int, seed: int,
                 seedable: bool = True) -> None:
        if seedable:
            _warn_generators(loader)
        self.rank = rank
        self.seed = int(seed)
        # The rebuilt loader draws its workers' base seed from this generator when a pass
        # starts, instead of from torch's global RNG: seeded from (seed, rank, epoch), a resumed
        # pass gets the same worker seeds as the uninterrupted one and the global RNG stream
        # (dropout, ...) is not disturbed by starting a pass.
        self.generator = torch.Generator()
        #: the seedable samplers this source put in place of the user's (``set_seed`` reseeds
        #: them; a seedable sampler the user passed keeps its own seed)
        self.seeded: list[SeedableSampler | SeedableRandomSampler] = []
        #: the generator the sampler draws each pass's order from, kept in step across ranks
        #: by the prepared loader (``use_seedable_sampler=False``, map-style loaders only)
        self.pass_generator: torch.Generator | None = None

    def set_epoch(self, epoch: int) -> None:
        for target in self.epoch_targets:
            target.set_epoch(epoch)
        self.generator.manual_seed(epoch_seed(epoch_seed(self.seed, self.rank), epoch))

    def set_seed(self, seed: int) -> None:
        self.seed = int(seed)
        for sampler in self.seeded:
            if isinstance(sampler, SeedableSampler):
                sampler.seed = int(seed)
            else:
                sampler.initial_seed = int(seed)

    def steps(self, epoch: int, skip: int) -> Iterator[Pair]:
        """``(batch, step)`` pairs of one pass, after ``skip`` batches of this rank."""
        raise NotImplementedError

    @property
    def rank_local(self) -> bool:
        """Whether each rank yields its own stream whole (see ``accel.data.local``)."""
        return False

    def shard_sampler(self) -> BatchSamplerShard | None:
        """The batch sampler that shards this source (map-style sources only): its
        ``even_batches`` can be changed between passes."""
        return None

    def num_rounds(self) -> int:
        """Rounds per epoch, the same on every rank (``TypeError`` when unknown)."""
        return len(self)

    def __len__(self) -> int:
        raise NotImplementedError


class MapSource(_Source):
    """Batch-level sharding of a map-style loader through a new batch sampler."""

    def __init__(self, loader: DataLoader[Any], *, rank: int, world: int, even: bool,
                 split: bool, seed: int, seedable: bool = True) -> None:
        super().__init__(loader, rank=rank, seed=seed, seedable=seedable)
        self.seedable = seedable
        given = given_batch_sampler(loader)
        singles = given is None
        if singles:
            if split and world > 1:
                raise ValueError("split_batches=True needs a DataLoader with a batch_size; got "
                                 "batch_size=None (the dataset yields whole batches); pass "
                                 "batch_size= or a torch BatchSampler as batch_sampler=")
            sampler = self._seedable(loader.sampler, seed)
            batches: Any = _Singles(sampler)
            nominal: int | None = 1
        else:
            batches, sampler = self._batches(given, seed)
            nominal = loader.batch_size or getattr(batches, "batch_size", None)
        split_size = self._split_size(nominal, world) if split and world > 1 else None
        self.shard = BatchSamplerShard(batches, world, rank, split_batches=split_size is not None,
                                       even_batches=even, singles=singles)
        # Without seedable sampling a user's loader generator seeds the workers, as in torch
        # (and Accelerate): each pass draws the base seed from it before the sampler's order.
        workers = self.generator if seedable or loader.generator is None else loader.generator
        if loader.batch_sampler is None:  # the shard's items go where the user's sampler was
            self.loader = rebuild_loader(loader, in_order=True, sampler=self.shard,
                                         batch_size=None, generator=workers)
        else:
            self.loader = rebuild_loader(loader, in_order=True, batch_sampler=self.shard,
                                         generator=workers)
        self.batch_size = split_size or nominal
        self.total_batch_size = (nominal if split_size or nominal is None else nominal * world)
        self.epoch_targets = [t for t in {id(x): x for x in (sampler, batches, loader.dataset)}
                              .values() if hasattr(t, "set_epoch")]

    def _seedable(self, sampler: Any, seed: int) -> Any:
        if not self.seedable:
            self.pass_generator = _pass_generator(sampler)
            return sampler
        seeded = _seedable(sampler, seed)
        if seeded is not sampler:
            self.seeded.append(seeded)
        return seeded

    def _batches(self, batch_sampler: Any, seed: int) -> tuple[Any, Any]:
        """The batch sampler with its inner sampler made seedable (on a shallow copy)."""
        inner = getattr(batch_sampler, "sampler", None)
        seeded = self._seedable(inner, seed) if inner is not None else None
        if seeded is inner:
            return batch_sampler, inner
        batches = copy.copy(batch_sampler)
        batches.sampler = seeded
        return batches, seeded

    @staticmethod
    def _split_size(nominal: int | None, world: int) -> int:
        if not isinstance(nominal, int) or nominal % world:
            raise ValueError(
                f"split_batches=True splits each batch across {world} processes, so batch_size "
                f"must be a round multiple of {world}; got batch_size={nominal}. Use a batch size "
                f"divisible by {world} or split_batches=False")
        return nominal // world

    def steps(self, epoch: int, skip: int) -> Iterator[Pair]:
        run = EpochRun(epoch=epoch, skip=skip)
        self.shard.next_run = run
        for batch in self.loader:
            if not run.steps or run.steps[0].payload is None:
                raise RuntimeError("internal error: a batch arrived without its plan step")
            yield batch, run.steps.popleft()
        while run.steps:
            yield None, run.steps.popleft()

    def shard_sampler(self) -> BatchSamplerShard:
        return self.shard

    def num_rounds(self) -> int:
        return self.shard.num_rounds()

    def __len__(self) -> int:
        return len(self.shard)


class IterableSource(_Source):
    """Every rank reads the whole stream and keeps chunk ``i * world + rank``; a rank-local
    stream (``local``, see ``accel.data.local``) is kept whole on its rank instead."""

    def __init__(self, loader: DataLoader[Any], *, rank: int, world: int, even: bool,
                 split: bool, seed: int = 0, local: RankLocal | None = None) -> None:
        super().__init__(loader, rank=rank, seed=seed)
        self.local = local or RankLocal(known=False, rank=rank, world=world, even=even,
                                        exchange=None, share=None)
        self.world, self.even = world, even and world > 1
        self.batched = loader.batch_size is not None
        self.drop_last = loader.drop_last
        self.dataset = loader.dataset
        nominal = loader.batch_size
        self.split = split and world > 1
        chunk: int | None = nominal
        if self.split:
            if nominal is None:
                raise ValueError("split_batches=True needs a DataLoader with a batch_size; got "
                                 "batch_size=None (the dataset yields whole batches)")
            chunk = MapSource._split_size(nominal, world)
        self.chunk = chunk
        self.batch_size = chunk
        self.total_batch_size = None if nominal is None else (nominal if self.split
                                                              else nominal * world)
        self.epoch_targets = [loader.dataset] if hasattr(loader.dataset, "set_epoch") else []
        self.loader = self._reader(loader)

    def _reader(self, loader: DataLoader[Any]) -> DataLoader[Any]:
        """The loader this source reads ``(chunk, samples)`` pairs from, in stream order."""
        return rebuild_loader(loader, in_order=True, batch_size=self.chunk,
                              collate_fn=CountingCollate(loader.collate_fn, self.batched),
                              drop_last=loader.drop_last and not self.split,
                              generator=self.generator)

    def steps(self, epoch: int, skip: int) -> Iterator[Pair]:
        del epoch  # the dataset's own set_epoch has been called
        chunks = self.local.detect(((batch,), count) for batch, count in self.loader)
        if self.local.rank_local:
            if self.split and self.drop_last:  # the rank's share of an incomplete final batch
                chunks = (chunk for chunk in chunks if chunk[1] >= (self.chunk or 1))
            for payload, step in self.local.steps(chunks, skip=skip):
                yield payload[0], step
            return
        whole = (self.chunk or 1) * self.world  # samples in a complete split batch
        rounds = ChunkRounds(chunks, world=self.world, rank=self.rank, keep_padding=self.even,
                             drop_below=whole if self.split and self.drop_last else None)
        pad = rounds.pad if self.even else None
        for step in rank_steps(rounds, rank=self.rank, world=self.world, pad=pad, skip=skip):
            yield (None if step.payload is None else step.payload[0]), step

    @property
    def rank_local(self) -> bool:
        return self.local.rank_local

    def own_batches(self) -> int | None:
        """Batches in this rank's whole stream (``None`` when its dataset has no length)."""
        try:
            n = len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            return None
        size = self.chunk or 1
        return n // size if self.drop_last and (self.batched or self.split) else -(-n // size)

    def _counts(self) -> tuple[int, int]:
        """(rounds per epoch, batches of this rank) from the dataset's length."""
        if self.local.rank_local:  # every rank takes as many steps as the longest stream
            steps = self.local.steps_per_pass
            if steps is None:
                steps = self.own_batches() if self.local.exchange is None else None
            if steps is None:
                raise TypeError("the length of a rank-local stream is its longest rank's, "
                                "unknown unless every rank's dataset has a __len__")
            return steps, steps
        n = self._samples()
        world, rank, size = self.world, self.rank, self.chunk or 1
        if self.split:
            full, rest = divmod(n, size * world)
            if self.drop_last or not rest:
                return full, full
            return full + 1, full + (self.even or rank * size < rest)
        chunks = n // size if self.drop_last and self.batched else -(-n // size)
        rounds = -(-chunks // world)
        return rounds, rounds if self.even else chunks // world + (rank < chunks % world)

    def _samples(self) -> int:
        """Samples per pass: the dataset's length (``TypeError`` when it has none)."""
        return len(self.dataset)  # type: ignore[arg-type]

    def num_rounds(self) -> int:
        return self._counts()[0]

    def __len__(self) -> int:
        return self._counts()[1]


class DispatchSource(IterableSource):
    """``dispatch_batches=True``: rank 0 reads the loader and sends each batch to every rank
    (one ``share`` per batch: a pickled object, so shapes and structure may change from batch
    to batch); every rank then cuts the same rounds :class:`IterableSource` cuts and keeps its
    own, so ``even_batches``, ``split_batches``, ``drop_last`` and exact ``gather_for_metrics``
    behave alike. The other ranks never iterate their loader (their data may be unreadable).

    A map-style loader is read in its sampler's order (a ``RandomSampler`` becomes seedable:
    epoch ``e`` draws from ``seed + e``, so a resumed epoch repeats its order), or in its own
    batch sampler's batches (each one rank's batch; not with ``split_batches``).
    """

    def __init__(self, loader: DataLoader[Any], *, rank: int, world: int, even: bool,
                 split: bool, seed: int, share: Callable[[Any], Any] | None) -> None:
        #: a map-style loader's sampler or batch sampler (set by ``_reader``), else ``None``
        self.sampler: Any = None
        super().__init__(loader, rank=rank, world=world, even=even, split=split, seed=seed)
        #: ``share(obj)`` is rank 0's ``obj`` on every rank (``None``: one process)
        self.share = share

    def _reader(self, loader: DataLoader[Any]) -> DataLoader[Any]:
        if isinstance(loader.dataset, IterableDataset):
            return super()._reader(loader)
        if loader.batch_size is None:  # the user's batch sampler: each of its batches is a chunk
            self.sampler = given_batch_sampler(loader)
            inner = getattr(self.sampler, "sampler", None)
            self.epoch_targets = [t for t in (self.sampler, inner) if hasattr(t, "set_epoch")]
            return rebuild_loader(loader, in_order=True, batch_sampler=self.sampler,
                                  collate_fn=CountingCollate(loader.collate_fn, False),
                                  generator=self.generator)
        self.sampler = _seedable(loader.sampler, self.seed)
        if self.sampler is not loader.sampler:
            self.seeded.append(self.sampler)
        self.epoch_targets = [self.sampler] if hasattr(self.sampler, "set_epoch") else []
        return rebuild_loader(loader, in_order=True, sampler=self.sampler,
                              batch_size=self.chunk,
                              collate_fn=CountingCollate(loader.collate_fn, self.batched),
                              drop_last=loader.drop_last and not self.split,
                              generator=self.generator)

    def _samples(self) -> int:
        """Samples per pass (batches, with the user's batch sampler: each is one chunk)."""
        return len(self.sampler) if self.sampler is not None else super()._samples()

    def steps(self, epoch: int, skip: int) -> Iterator[Pair]:
        del epoch  # the sampler's or dataset's set_epoch has been called
        whole = (self.chunk or 1) * self.world
        rounds = ChunkRounds(self._received(), world=self.world, rank=self.rank,
                             keep_padding=self.even,
                             drop_below=whole if self.split and self.drop_last else None)
        pad = rounds.pad if self.even else None
        for step in rank_steps(rounds, rank=self.rank, world=self.world, pad=pad, skip=skip):
            yield (None if step.payload is None else step.payload[0]), step

    def _received(self) -> Iterator[tuple[Any, int]]:
        """Rank 0's ``((batch,), samples)`` chunks, on every rank, then the end. Every rank
        pulls as many as the others (the rounds are cut alike), so the broadcasts pair up."""
        # alone (one process, or another rank's shard built here) every rank reads for itself
        chunks = iter(self.loader) if self.rank == 0 or self.share is None else None
        while True:
            item = next(chunks, None) if chunks is not None else None
            if self.share is not None:
                item = self.share(item)
            if item is None:
                return
            batch, count = item
            yield (batch,), int(count)

    @property
    def rank_local(self) -> bool:
        return False


class PassthroughSource(_Source):
    """A loader that is already sharded by rank: only tracking (and real counts) are added."""

    def __init__(self, loader: DataLoader[Any], *, rank: int, world: int,
                 sampler: DistributedSampler[Any] | None, seed: int = 0) -> None:
        super().__init__(loader, rank=rank, seed=seed)
        self.loader = _same_sampling(loader, self.generator)
        self.sampler = sampler
        self.batch_size = loader.batch_size
        self.total_batch_size = None if loader.batch_size is None else loader.batch_size * world
        # The DistributedSampler may sit inside a batch sampler, which need not pass set_epoch on.
        targets = (loader.sampler, loader.batch_sampler, sampler, loader.dataset)
        self.epoch_targets = [t for t in {id(t): t for t in targets if t is not None}.values()
                              if hasattr(t, "set_epoch")]
        batch_sampler = loader.batch_sampler
        # Real counts follow from positions when a plain BatchSampler reads the sampler.
        self._positions = (sampler is not None and type(batch_sampler) is BatchSampler
                           and getattr(batch_sampler, "sampler", None) is sampler)

    def _step(self, index: int, *, batch: Any, last: bool) -> Step:
        if not self._positions:
            size = count_samples(batch)
            return Step(index, size, size, last)
        sampler, size = self.sampler, self.loader.batch_size or 1
        assert sampler is not None
        start = index * size
        length = min(size, sampler.num_samples - start)
        # DistributedSampler pads at the end: position p of this rank is global position
        # rank + p * replicas, real while that is below the dataset length.
        total = len(sampler.dataset)  # type: ignore[arg-type]  # DistributedSampler needs len
        real_total = (sampler.num_samples if sampler.drop_last else
                      max(0, -(-(total - sampler.rank) // sampler.num_replicas)))
        return Step(index, length, max(0, min(length, real_total - start)), last)

    def steps(self, epoch: int, skip: int) -> Iterator[Pair]:
        del epoch
        it = itertools.islice(iter(self.loader), skip, None)
        ahead = next(it, _END)
        index = skip
        while ahead is not _END:
            batch, ahead = ahead, next(it, _END)
            yield batch, self._step(index, batch=batch, last=ahead is _END)
            index += 1

    def __len__(self) -> int:
        return len(self.loader)


_END: Any = object()

