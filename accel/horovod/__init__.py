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
from .compression import Compression, Compressor
from .optimizer import DistributedOptimizer
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .reduce_op import Adasum, Average, Max, Min, Product, Sum

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "Sum",
    "Compression",
    "Compressor",
    "DistributedOptimizer",
    "ProcessSet",
    "add_process_set",
    "cross_rank",
    "cross_size",
    "global_process_set",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "remove_process_set",
    "shutdown",
    "size",
]
