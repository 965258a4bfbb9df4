"""Data loading: rank sharding, device placement, position tracking and exact resume
(``load_state`` restores positions with ``use_stateful_dataloader=True``).

Map-style loaders are sharded at the batch level: the batch sampler's batches ``B0, B1, ...``
are dealt round-robin, rank ``r`` taking ``B[i * world + r]`` (with ``split_batches`` each batch
is cut into ``world`` contiguous pieces instead), so the ranks' batches of one round, in rank
order, are the single-process order. Iterable datasets are read whole by every rank, which keeps
chunk ``i * world + rank``. Loaders that are already sharded (a ``DistributedSampler`` built for
this job) are left alone, and a rank-local stream (``already_sharded=True``, a known pre-split
source, or streams that differ across ranks) is kept whole on its rank, padded so that every rank
takes as many steps (``accel.data.local``).

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> from accel.config import DataLoaderConfiguration
    >>> from accel.distributed import Communicator, ProcessContext
    >>> ctx = ProcessContext.single()
    >>> loader = build_prepared_loader(DataLoader(range(3), batch_size=2), ctx=ctx,
    ...     comm=Communicator(ctx), device=torch.device("cpu"),
    ...     config=DataLoaderConfiguration(), tracker=DataTracker(), seed=0)
    >>> [batch.tolist() for batch in loader]
    [[0, 1], [2]]
"""

from __future__ import annotations

from .iterable import IterableDatasetShard
from .loader import (
    DataTracker,
    PreparedDataLoader,
    build_prepared_loader,
    override_even_batches,
    skip_first_batches,
)
from .metrics import gather_for_metrics
from .samplers import BatchSamplerShard, SeedableRandomSampler, SeedableSampler, SkipBatchSampler
from .sources import DispatchSource
from .transfer import send_to_device
from .trim import trim_batch

__all__ = [
    "BatchSamplerShard",
    "DataTracker",
    "DispatchSource",
    "IterableDatasetShard",
    "PreparedDataLoader",
    "SeedableRandomSampler",
    "SeedableSampler",
    "SkipBatchSampler",
    "build_prepared_loader",
    "gather_for_metrics",
    "override_even_batches",
    "send_to_device",
    "skip_first_batches",
    "trim_batch",
]
