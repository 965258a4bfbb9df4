"""``import accel.horovod as hvd``: Horovod's ``horovod.torch`` API on torch.distributed.

A script written for Horovod runs with its import line changed, under ``accel launch``,
torchrun, ``mpirun`` or ``srun`` (no MPI or Horovod build needed): the process group is the one
accel's connector starts, and the collectives are torch.distributed's.

Example:
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> hvd.size()
    1
    >>> hvd.shutdown()
"""

from __future__ import annotations

from . import elastic
from .basics import (
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from .capabilities import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)
from .compression import Compression, Compressor
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .exchange import (
    allgather,
    allgather_async,
    alltoall,
    alltoall_async,
    barrier,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
)
from .functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .handles import poll, synchronize
from .ops import (
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from .optimizer import DistributedOptimizer
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .reduce_op import Adasum, Average, Max, Min, Product, Sum
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    "Adasum",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "Average",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "Compression",
    "Compressor",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "DistributedOptimizer",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "Max",
    "Min",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "ProcessSet",
    "Product",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "Sum",
    "SyncBatchNorm",
    "synchronize",
]
