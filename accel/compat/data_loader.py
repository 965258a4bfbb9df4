"""What scripts import from ``accelerate.data_loader``, under the same names.

- ``prepare_data_loader``: Accelerate's module-level function and signature; it shards a loader
  for one process without an ``Accelerator`` (the rank and world size default to this
  process's; pass both to build any rank's shard, e.g. to inspect it in one process).
- ``skip_first_batches``, ``SeedableRandomSampler``, ``BatchSamplerShard``,
  ``SkipBatchSampler``: accel's own (see :mod:`accel.data`), with Accelerate's arguments.
- ``DataLoaderShard``: the class of every loader ``prepare()`` returns (for ``isinstance``);
  calling it, as in Accelerate, prepares ``DataLoader(dataset, **kwargs)`` for one process.
- ``SkipDataLoader``: a ``DataLoader`` whose passes leave out their first batches.
- With ``use_stateful_dataloader=True`` and torchdata installed, the loaders of all three
  classes are also torchdata's ``StatefulDataLoader`` (``accel.data.stateful``); a prepared
  loader keeps accel's iteration and ``state_dict`` format.
- ``IterableDatasetShard``: Accelerate's sample-level shard of an iterable dataset (accel's own
  class; a prepared loader shards an iterable dataset's batches itself and never makes one).
- ``DataLoaderDispatcher``: the class of the loaders prepared with ``dispatch_batches=True``
  (rank 0 reads, every rank gets its batches); calling it, as in Accelerate, prepares
  ``DataLoader(dataset, **kwargs)`` that way over this job's processes.

Example:
    >>> from torch.utils.data import DataLoader
    >>> shard = prepare_data_loader(DataLoader(range(6), batch_size=2), num_processes=2,
    ...                             process_index=1)
    >>> [b.tolist() for b in shard], type(shard.batch_sampler).__name__  # 3 batches: padded
    ([[2, 3], [0, 1]], 'BatchSamplerShard')
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._base.warn import warn_user
from ..config.settings import DataLoaderConfiguration
from ..data import (
    BatchSamplerShard,
    DataTracker,
    DispatchSource,
    IterableDatasetShard,
    PreparedDataLoader,
    SeedableRandomSampler,
    SkipBatchSampler,
    build_prepared_loader,
    skip_first_batches,
)
from ..data.stateful import stateful_variant
from ..distributed import Communicator, ProcessContext
from ..run.connector import connect_process

__all__ = ["BatchSamplerShard", "DataLoaderDispatcher", "DataLoaderShard",
           "IterableDatasetShard", "SeedableRandomSampler", "SkipBatchSampler", "SkipDataLoader",
           "prepare_data_loader", "skip_first_batches"]


class _ShardClass(type):
    """``DataLoaderShard``'s type: every prepared loader is an instance, and calling it builds
    one process's loader from a dataset and ``DataLoader`` arguments."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, PreparedDataLoader)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, PreparedDataLoader)

    def __call__(cls, dataset: Any, device: torch.device | None = None,
                 rng_types: list[Any] | None = None, synchronized_generator: Any = None,
                 skip_batches: int = 0, use_stateful_dataloader: bool = False,
                 torch_device_mesh: Any = None, iteration: int = 0,
                 **dataloader_kwargs: Any) -> PreparedDataLoader:
        if synchronized_generator is not None or skip_batches:
            raise NotImplementedError(
                "DataLoaderShard(synchronized_generator=..., skip_batches=...) is not supported: "
                "a prepared loader synchronizes its own sampler generator; skip batches with "
                "skip_first_batches(loader, num_batches)")
        shard = prepare_data_loader(
            DataLoader(dataset, **dataloader_kwargs), device, num_processes=1, process_index=0,
            put_on_device=device is not None, rng_types=rng_types,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh)
        if iteration:
            shard.set_epoch(iteration)
        return shard


class DataLoaderShard(metaclass=_ShardClass):
    """The class of the loaders ``prepare()`` returns (Accelerate's name, for ``isinstance``).

    Called as Accelerate's, ``DataLoaderShard(dataset, device=None, ..., **dataloader_kwargs)``
    builds ``DataLoader(dataset, **dataloader_kwargs)`` prepared for one process: no sharding,
    batches moved to ``device`` when given, ``end_of_dataloader`` set on the last batch, and
    ``iteration`` the first epoch. The loader belongs to no ``Accelerator`` (prepare the
    ``DataLoader`` with ``accelerator.prepare`` to shard it and gather its metrics).

    Example:
        >>> shard = DataLoaderShard(range(4), batch_size=2)
        >>> [(b.tolist(), shard.end_of_dataloader) for b in shard]
        [([0, 1], False), ([2, 3], True)]
    """


class SkipDataLoader(DataLoader[Any]):
    """A ``DataLoader`` whose every pass leaves out its first ``skip_batches`` batches
    (Accelerate's class and arguments; ``dataloader_kwargs`` go to ``DataLoader``).

    The skipped batches are loaded and dropped, as in Accelerate; ``skip_first_batches`` skips
    a map-style loader's batches at its sampler instead, without loading them. With
    ``use_stateful_dataloader=True`` (torchdata installed) the loader is also torchdata's
    ``StatefulDataLoader``, whose ``state_dict()`` counts the skipped batches too, as in
    Accelerate.

    Example:
        >>> [b.tolist() for b in SkipDataLoader(range(6), skip_batches=1, batch_size=2)]
        [[2, 3], [4, 5]]
    """

    def __new__(cls, dataset: Any = None, skip_batches: int = 0,
                use_stateful_dataloader: bool = False, **dataloader_kwargs: Any) -> SkipDataLoader:
        if not use_stateful_dataloader:
            return super().__new__(cls)
        stateful = stateful_variant(cls)
        if stateful is None:
            raise NotImplementedError(
                "SkipDataLoader(use_stateful_dataloader=True) needs torchdata's "
                "StatefulDataLoader: `pip install torchdata` (or accel[stateful]), or prepare "
                "the loader with DataLoaderConfiguration(use_stateful_dataloader=True), whose "
                "state_dict() resumes exactly without torchdata")
        return super().__new__(stateful)

    def __init__(self, dataset: Any, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, **dataloader_kwargs: Any) -> None:
        if int(skip_batches) < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        super().__init__(dataset, **dataloader_kwargs)
        self.skip_batches = int(skip_batches)
        self.use_stateful_dataloader = bool(use_stateful_dataloader)  # see __new__

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return itertools.islice(super().__iter__(), self.skip_batches, None)

    def __len__(self) -> int:
        return max(0, super().__len__() - self.skip_batches)


class _DispatcherClass(type):
    """``DataLoaderDispatcher``'s type: the prepared loaders whose batches rank 0 reads and
    sends are instances, and calling it builds one from a dataset and ``DataLoader``
    arguments."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, PreparedDataLoader) and \
            isinstance(instance._source, DispatchSource)

    def __call__(cls, dataset: Any, split_batches: bool = False, skip_batches: int = 0,
                 use_stateful_dataloader: bool = False, _drop_last: bool = False,
                 _non_blocking: bool = False, slice_fn: Callable[..., Any] | None = None,
                 torch_device_mesh: Any = None, **dataloader_kwargs: Any) -> Any:
        if slice_fn is not None or _drop_last:
            raise NotImplementedError(
                "DataLoaderDispatcher(slice_fn=..., _drop_last=True) is not supported: accel "
                "sends each rank whole batches collated from its own samples, so no slicing "
                "applies; pass drop_last=True to drop an incomplete batch")
        loader = prepare_data_loader(
            DataLoader(dataset, **dataloader_kwargs), split_batches=split_batches,
            dispatch_batches=True, non_blocking=_non_blocking,
            use_stateful_dataloader=use_stateful_dataloader,
            torch_device_mesh=torch_device_mesh)
        return skip_first_batches(loader, int(skip_batches)) if skip_batches else loader


class DataLoaderDispatcher(metaclass=_DispatcherClass):
    """A prepared loader whose batches rank 0 reads and sends to every rank (Accelerate's name;
    ``DataLoaderConfiguration(dispatch_batches=True)`` gives one from ``prepare()``).

    Called as Accelerate's, ``DataLoaderDispatcher(dataset, split_batches=False,
    skip_batches=0, ..., **dataloader_kwargs)`` prepares ``DataLoader(dataset,
    **dataloader_kwargs)`` over this job's processes.

    Example:
        >>> loader = DataLoaderDispatcher(range(6), batch_size=4)
        >>> [(b.tolist(), loader.end_of_dataloader) for b in loader]
        [([0, 1, 2, 3], False), ([4, 5], True)]
        >>> isinstance(loader, DataLoaderDispatcher), isinstance(loader, DataLoaderShard)
        (True, True)
    """


def prepare_data_loader(
    dataloader: DataLoader[Any],
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> PreparedDataLoader:
    """Shard ``dataloader`` for process ``process_index`` of ``num_processes`` (Accelerate's
    function and arguments; see ``DataLoaderConfiguration`` for the loader options).

    Both default to this process's place in the job. With ``put_on_device`` batches are moved
    to ``device`` (no move when ``device`` is None, as in Accelerate). The shuffle seed is
    ``data_seed``, else rank 0's ``torch.initial_seed()``. The loader belongs to no
    ``Accelerator``: ``accelerator.gather_for_metrics`` and ``accelerator.end_of_dataloader``
    do not see it (prepare it with ``accelerator.prepare`` for those). ``rng_types`` is
    accepted and unused, as by ``Accelerator``; with ``use_seedable_sampler=False`` a
    shuffling sampler draws from its own generator, synchronized from rank 0 at every pass.

    Raises:
        NotImplementedError: ``torch_device_mesh`` (accel has no tensor/context parallelism).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> dl = prepare_data_loader(DataLoader(range(8), batch_size=4), num_processes=2,
        ...                          process_index=0, split_batches=True)
        >>> [b.tolist() for b in dl]
        [[0, 1], [4, 5]]
    """
    del rng_types  # see the docstring
    if torch_device_mesh is not None:
        raise NotImplementedError(
            "prepare_data_loader(torch_device_mesh=...) is not supported: accel shards data "
            "over all processes (data parallel only); drop the argument")
    if slice_fn_for_dispatch is not None:
        warn_user("prepare_data_loader(slice_fn_for_dispatch=...) is not used: with "
                  "dispatch_batches=True accel sends each rank whole batches collated from its "
                  "own samples, so nothing is sliced")
    config = DataLoaderConfiguration(
        split_batches=split_batches, dispatch_batches=dispatch_batches,
        even_batches=even_batches, data_seed=data_seed, non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader,
        use_seedable_sampler=use_seedable_sampler)
    setup = connect_process()
    ctx, comm = _shard_context(setup.context, num_processes, process_index)
    seed = data_seed if data_seed is not None else _initial_seed(comm)
    place = put_on_device and device is not None
    return build_prepared_loader(
        dataloader, ctx=ctx, comm=comm, device=device if place else None, config=config,
        tracker=DataTracker(groups=False), seed=seed,
        after_batch=setup.hardware.batch_hook() if place else None)


def _shard_context(here: ProcessContext, num_processes: int | None, process_index: int | None
                   ) -> tuple[ProcessContext, Communicator]:
    """The context to shard for, and the communicator the ranks agree over: this job's own
    when the shard is this process's, else one of this process alone (no collective)."""
    world = here.world_size if num_processes is None else int(num_processes)
    rank = here.rank if process_index is None else int(process_index)
    if not 0 <= rank < world:
        raise ValueError(f"process_index={rank} is not a rank of num_processes={world}; "
                         f"pass 0 <= process_index < num_processes")
    if (world, rank) == (here.world_size, here.rank):
        return here, Communicator(here)
    alone = replace(here, rank=0, local_rank=0, world_size=1, local_world_size=1)
    return replace(here, rank=rank, world_size=world), Communicator(alone)


def _initial_seed(comm: Communicator) -> int:
    """Rank 0's torch seed, on every rank of ``comm``."""
    return int(comm.broadcast_object_list([torch.initial_seed() % (2**63)])[0])
