"""accel: one PyTorch training loop on CPU, CUDA or XLA, in one process or many.

Names are imported lazily so that ``import accel`` stays cheap (``accel --help`` does not import
torch at all).

Example:
    >>> import accel
    >>> accel.__version__
    '0.1.0'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Accelerator": "accel.accelerator",
    "AutocastKwargs": "accel.config",
    "DDPCommunicationHookType": "accel.config",
    "DataLoaderConfiguration": "accel.config",
    "DistributedDataParallelKwargs": "accel.config",
    "DistributedType": "accel.config",
    "GradScalerKwargs": "accel.config",
    "GradientAccumulationPlugin": "accel.config",
    "InitProcessGroupKwargs": "accel.config",
    "PrecisionType": "accel.config",
    "ProjectConfiguration": "accel.config",
    "AcceleratorState": "accel.state",
    "GradientState": "accel.state",
    "PartialState": "accel.state",
    "TorchDynamoPlugin": "accel.dynamo",
    "FullyShardedDataParallelPlugin": "accel.fsdp_config",
    "ParallelismConfig": "accel.fsdp_config",
    "GeneralTracker": "accel.tracking",
    "debug_launcher": "accel.launch.notebook",
    "find_executable_batch_size": "accel.memory",
    "is_rich_available": "accel.availability",
    "free_memory": "accel.memory",
    "infer_auto_device_map": "accel.big_modeling",
    "init_empty_weights": "accel.big_modeling",
    "cpu_offload": "accel.big_modeling",
    "cpu_offload_with_hook": "accel.big_modeling",
    "disk_offload": "accel.big_modeling",
    "dispatch_model": "accel.big_modeling",
    "load_checkpoint_and_dispatch": "accel.big_modeling",
    "load_checkpoint_in_model": "accel.big_modeling",
    "init_on_device": "accel.big_modeling",
    "get_logger": "accel.logging",
    "load": "accel.checkpoint",
    "notebook_launcher": "accel.launch.notebook",
    "release_memory": "accel.memory",
    "save": "accel.checkpoint",
    "set_seed": "accel.utils",
    "skip_first_batches": "accel.data",
    "spawn": "accel.launch.spawning",
    "synchronize_rng_states": "accel.utils",
    "tqdm": "accel.progress",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover
    from .accelerator import Accelerator as Accelerator
    from .availability import is_rich_available as is_rich_available
    from .big_modeling import cpu_offload as cpu_offload
    from .big_modeling import cpu_offload_with_hook as cpu_offload_with_hook
    from .big_modeling import disk_offload as disk_offload
    from .big_modeling import dispatch_model as dispatch_model
    from .big_modeling import infer_auto_device_map as infer_auto_device_map
    from .big_modeling import init_empty_weights as init_empty_weights
    from .big_modeling import init_on_device as init_on_device
    from .big_modeling import load_checkpoint_and_dispatch as load_checkpoint_and_dispatch
    from .big_modeling import load_checkpoint_in_model as load_checkpoint_in_model
    from .checkpoint import load as load
    from .checkpoint import save as save
    from .config import AutocastKwargs as AutocastKwargs
    from .config import DataLoaderConfiguration as DataLoaderConfiguration
    from .config import DDPCommunicationHookType as DDPCommunicationHookType
    from .config import DistributedDataParallelKwargs as DistributedDataParallelKwargs
    from .config import DistributedType as DistributedType
    from .config import GradientAccumulationPlugin as GradientAccumulationPlugin
    from .config import GradScalerKwargs as GradScalerKwargs
    from .config import InitProcessGroupKwargs as InitProcessGroupKwargs
    from .config import PrecisionType as PrecisionType
    from .config import ProjectConfiguration as ProjectConfiguration
    from .data import skip_first_batches as skip_first_batches
    from .dynamo import TorchDynamoPlugin as TorchDynamoPlugin
    from .fsdp_config import FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin
    from .fsdp_config import ParallelismConfig as ParallelismConfig
    from .launch.notebook import debug_launcher as debug_launcher
    from .launch.notebook import notebook_launcher as notebook_launcher
    from .launch.spawning import spawn as spawn
    from .logging import get_logger as get_logger
    from .memory import find_executable_batch_size as find_executable_batch_size
    from .memory import free_memory as free_memory
    from .memory import release_memory as release_memory
    from .progress import tqdm as tqdm
    from .state import AcceleratorState as AcceleratorState
    from .state import GradientState as GradientState
    from .state import PartialState as PartialState
    from .tracking import GeneralTracker as GeneralTracker
    from .utils import set_seed as set_seed
    from .utils import synchronize_rng_states as synchronize_rng_states
