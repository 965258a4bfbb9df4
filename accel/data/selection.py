"""Which source a prepared loader reads from, and the check that every rank chose the same.

``select_source`` picks one of ``accel.data.sources`` for a ``DataLoader``: a loader with a
``DistributedSampler`` built for this job is left alone, an iterable dataset is split at the batch
level unless its stream is rank-local (``accel.data.local``), and a map-style dataset is split
through its batch sampler; with ``dispatch_batches=True`` rank 0 reads and sends the batches.
``check_same_everywhere`` compares the ranks' choices in one collective at ``prepare()``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..config.settings import DataLoaderConfiguration
from ..distributed.context import ProcessContext
from ..distributed.ops import Communicator
from .local import RankLocal, presplit_source
from .sources import (
    DispatchSource,
    IterableSource,
    MapSource,
    PassthroughSource,
    _Source,
    find_distributed_sampler,
)

__all__ = ["check_same_everywhere", "dataset_length", "select_source"]


def dataset_length(dataset: Any) -> int | None:
    """``len(dataset)``, or ``None`` when it has none."""
    try:
        return len(dataset)
    except TypeError:
        return None


def select_source(loader: DataLoader[Any], *, ctx: ProcessContext,
                   config: DataLoaderConfiguration, seed: int, comm: Communicator) -> _Source:
    world, rank = ctx.world_size, ctx.rank
    sampler = find_distributed_sampler(loader)
    if config.already_sharded and sampler is None and not isinstance(loader.dataset,
                                                                     IterableDataset):
        raise ValueError(
            f"DataLoaderConfiguration(already_sharded=True) is for iterable datasets (a stream "
            f"each rank reads for itself), but this loader's dataset, "
            f"{type(loader.dataset).__name__}, is map-style: prepare() splits its indices by "
            "rank. Drop the flag; for map-style data that is already split by rank, wrap it in "
            "an IterableDataset that yields this rank's items, or pass a DataLoader with a "
            "DistributedSampler built for this job (prepare() leaves that alone)")
    if config.dispatch_batches:
        if sampler is not None or config.already_sharded:
            raise ValueError(
                "DataLoaderConfiguration(dispatch_batches=True) has rank 0 read all the data and "
                "send each rank its share, but this loader is already split by rank ("
                + ("a DistributedSampler" if sampler is not None else "already_sharded=True")
                + "); drop one of the two")
        channel = _channels(comm, world)["share"]
        return DispatchSource(loader, rank=rank, world=world, even=config.even_batches,
                              split=config.split_batches, seed=seed,
                              share=None if channel is None else functools.partial(channel,
                                                                                   src=0))
    if sampler is not None:
        if sampler.num_replicas != world or sampler.rank != rank:
            raise ValueError(
                f"the DataLoader's DistributedSampler has num_replicas={sampler.num_replicas}, "
                f"rank={sampler.rank} but this process is rank {rank} of {world}; remove the "
                "DistributedSampler (prepare() shards the data itself) or build it for this job")
        return PassthroughSource(loader, rank=rank, world=world, sampler=sampler, seed=seed)
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        split_by_node = getattr(dataset, "_distributed", None)
        split_world = getattr(split_by_node, "world_size", world)
        if split_world != world:  # a Hugging Face dataset split by node
            raise ValueError(f"the dataset was split for {split_world} "
                             f"processes but this job has {world}; split it with "
                             f"split_dataset_by_node(..., world_size={world})")
        known = bool(config.already_sharded) or presplit_source(dataset) is not None
        local = RankLocal(known=known, rank=rank, world=world, even=config.even_batches,
                          **_channels(comm, world))
        return IterableSource(loader, rank=rank, world=world, even=config.even_batches,
                              split=config.split_batches, seed=seed, local=local)
    return MapSource(loader, rank=rank, world=world, even=config.even_batches,
                     split=config.split_batches, seed=seed,
                     seedable=bool(config.use_seedable_sampler))


def _channels(comm: Communicator, world: int) -> dict[str, Any]:
    """``exchange`` and ``share`` for ``RankLocal`` over ``comm``; ``None`` for a shard built
    in a process alone (its communicator does not reach the other ranks) or one process."""
    if not comm.ctx.world_size == world > 1:
        return {"exchange": None, "share": None}
    return {"exchange": lambda values: comm.gather(torch.tensor([values])).tolist(),
            "share": lambda obj, src: comm.broadcast_object_list([obj], src)[0]}


def check_same_everywhere(loader: DataLoader[Any], *, source: _Source, comm: Communicator,
                          already_sharded: bool) -> None:
    """Ranks must agree on what is sharded, or the shards overlap and miss samples silently.

    An iterable dataset's length may differ across ranks (a rank-local stream); the lengths
    are gathered in the same collective and tell the source (see ``RankLocal.decide``).
    """
    if comm.ctx.world_size == 1:
        return
    iterable = source if isinstance(source, IterableSource) and \
        not isinstance(source, DispatchSource) else None
    length = None if iterable is not None else dataset_length(loader.dataset)
    mine = (type(source).__name__, length, loader.batch_size, already_sharded)
    own = iterable.own_batches() if iterable is not None else None
    everyone = comm.gather_object([(mine, own)])
    if any(tuple(item) != mine for item, _ in everyone):
        lines = "; ".join(f"rank {r}: {tuple(item)}" for r, (item, _) in enumerate(everyone))
        raise ValueError("ranks prepared different data loaders (kind, dataset length, batch "
                         f"size, already_sharded): {lines}; every rank must prepare the same "
                         "loader with the same DataLoaderConfiguration")
    if iterable is not None and comm.ctx.world_size == iterable.world:
        iterable.local.decide([batches for _, batches in everyone])
