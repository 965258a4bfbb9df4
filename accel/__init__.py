"""accel: one PyTorch training loop on CPU, CUDA or XLA, in one process or many.

Names are imported lazily so that ``import accel`` stays cheap (``accel --help`` does not import
torch at all).

Example:
    >>> import accel
    >>> accel.__version__
    '1.0.0'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._base.version import __version__

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Accelerator": "accel.compat.accelerator",
    "AutocastKwargs": "accel.config.settings",
    "DDPCommunicationHookType": "accel.config.settings",
    "DataLoaderConfiguration": "accel.config.settings",
    "DistributedDataParallelKwargs": "accel.config.settings",
    "DistributedType": "accel.compat.distributed_type",
    "GradScalerKwargs": "accel.config.settings",
    "GradientAccumulationPlugin": "accel.config.settings",
    "InitProcessGroupKwargs": "accel.config.settings",
    "PrecisionType": "accel.config.settings",
    "ProjectConfiguration": "accel.config.settings",
    "AcceleratorState": "accel.compat.state",
    "GradientState": "accel.compat.state",
    "PartialState": "accel.compat.state",
    "TorchDynamoPlugin": "accel.strategy.compile",
    "FullyShardedDataParallelPlugin": "accel.config.fsdp",
    "ParallelismConfig": "accel.config.parallelism",
    "TorchContextParallelConfig": "accel.config.parallelism",
    "TorchTensorParallelConfig": "accel.config.parallelism",
    "GeneralTracker": "accel.tracking.trackers",
    "debug_launcher": "accel.launch.notebook",
    "find_executable_batch_size": "accel.run.memory",
    "is_rich_available": "accel.device.availability",
    "free_memory": "accel.run.memory",
    "infer_auto_device_map": "accel.big_modeling",
    "init_empty_weights": "accel.big_modeling",
    "cpu_offload": "accel.big_modeling",
    "cpu_offload_with_hook": "accel.big_modeling",
    "disk_offload": "accel.big_modeling",
    "dispatch_model": "accel.big_modeling",
    "load_checkpoint_and_dispatch": "accel.big_modeling",
    "load_checkpoint_in_model": "accel.big_modeling",
    "init_on_device": "accel.big_modeling",
    "get_logger": "accel.env.log",
    "load": "accel.checkpoint",
    "notebook_launcher": "accel.launch.notebook",
    "release_memory": "accel.run.memory",
    "save": "accel.checkpoint",
    "set_seed": "accel.utils",
    "skip_first_batches": "accel.data",
    "spawn": "accel.launch.spawning",
    "synchronize_rng_states": "accel.utils",
    "tqdm": "accel.run.progress",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        # torch-free, so that `import accel` stays cheap
        from .compat.refusals import refused_reason, stand_in

        reason = refused_reason("accel", name)
        if reason is None:
            raise AttributeError(f"module 'accel' has no attribute {name!r}")
        value: Any = stand_in("accel", name=name, reason=reason)  # raises with why when used
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover
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
    from .compat.accelerator import Accelerator as Accelerator
    from .compat.distributed_type import DistributedType as DistributedType
    from .compat.state import AcceleratorState as AcceleratorState
    from .compat.state import GradientState as GradientState
    from .compat.state import PartialState as PartialState
    from .config.fsdp import FullyShardedDataParallelPlugin as FullyShardedDataParallelPlugin
    from .config.parallelism import ParallelismConfig as ParallelismConfig
    from .config.parallelism import TorchContextParallelConfig as TorchContextParallelConfig
    from .config.parallelism import TorchTensorParallelConfig as TorchTensorParallelConfig
    from .config.settings import AutocastKwargs as AutocastKwargs
    from .config.settings import DataLoaderConfiguration as DataLoaderConfiguration
    from .config.settings import DDPCommunicationHookType as DDPCommunicationHookType
    from .config.settings import DistributedDataParallelKwargs as DistributedDataParallelKwargs
    from .config.settings import GradientAccumulationPlugin as GradientAccumulationPlugin
    from .config.settings import GradScalerKwargs as GradScalerKwargs
    from .config.settings import InitProcessGroupKwargs as InitProcessGroupKwargs
    from .config.settings import PrecisionType as PrecisionType
    from .config.settings import ProjectConfiguration as ProjectConfiguration
    from .data import skip_first_batches as skip_first_batches
    from .device.availability import is_rich_available as is_rich_available
    from .env.log import get_logger as get_logger
    from .launch.notebook import debug_launcher as debug_launcher
    from .launch.notebook import notebook_launcher as notebook_launcher
    from .launch.spawning import spawn as spawn
    from .run.memory import find_executable_batch_size as find_executable_batch_size
    from .run.memory import free_memory as free_memory
    from .run.memory import release_memory as release_memory
    from .run.progress import tqdm as tqdm
    from .strategy.compile import TorchDynamoPlugin as TorchDynamoPlugin
    from .tracking.trackers import GeneralTracker as GeneralTracker
    from .utils import set_seed as set_seed
    from .utils import synchronize_rng_states as synchronize_rng_states
