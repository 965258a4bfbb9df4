"""Accelerate's ``accelerate.utils.dataclasses``: the configuration objects scripts build.

Example:
    >>> DistributedType.MULTI_CPU.value, DataLoaderConfiguration().even_batches
    ('MULTI_CPU', True)
"""

from __future__ import annotations

from ..config.fsdp import FullyShardedDataParallelPlugin
from ..config.parallelism import (
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)
from ..config.settings import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    LoggerType,
    PrecisionType,
    ProjectConfiguration,
)
from ..strategy.compile import DynamoBackend, TorchDynamoPlugin
from .distributed_type import DistributedType

__all__ = ["AutocastKwargs", "DDPCommunicationHookType", "DataLoaderConfiguration",
           "DistributedDataParallelKwargs", "DistributedType", "GradScalerKwargs",
           "GradientAccumulationPlugin", "InitProcessGroupKwargs", "KwargsHandler", "LoggerType",
           "PrecisionType", "ProjectConfiguration", "DynamoBackend", "TorchDynamoPlugin",
           "FullyShardedDataParallelPlugin", "ParallelismConfig",
           "TorchContextParallelConfig", "TorchTensorParallelConfig"]
