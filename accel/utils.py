"""What Hugging Face Accelerate users import from ``accelerate.utils``.

The collectives here work on torch's default process group (started by an ``Accelerator``, by
torchrun, or by the user); with no group they are the world-size-1 no-ops.

Example:
    >>> import torch
    >>> from accel.utils import gather, set_seed
    >>> set_seed(0)
    >>> gather(torch.tensor([1, 2])).tolist()
    [1, 2]
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import env
from .config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    PrecisionType,
    ProjectConfiguration,
)
from .data import send_to_device, skip_first_batches
from .device import DEVICE_KINDS
from .distributed import Communicator, ProcessContext, build_context
from .memory import find_executable_batch_size, release_memory
from .rng import seed_everything

__all__ = [
    "AutocastKwargs", "DataLoaderConfiguration", "DistributedDataParallelKwargs",
    "DistributedType", "GradScalerKwargs", "GradientAccumulationPlugin", "InitProcessGroupKwargs",
    "PrecisionType", "ProjectConfiguration", "broadcast", "broadcast_object_list",
    "find_executable_batch_size", "gather", "gather_object", "pad_across_processes", "reduce",
    "release_memory", "send_to_device", "set_seed", "skip_first_batches",
]


def _comm() -> Communicator:
    """Collectives on torch's default group; the rank comes from the one derivation that the
    Accelerator uses too (``build_context``: the group's rank, the launcher's local rank)."""
    if not (dist.is_available() and dist.is_initialized()):
        return Communicator(ProcessContext(0, 0, 1, 1, 0, torch.device("cpu"), "gloo", "none"))
    kind = {"nccl": "cuda", "xla": "xla"}.get(str(dist.get_backend()), "cpu")
    return Communicator(build_context(env.detect_launch(), DEVICE_KINDS[kind]()))


def gather(tensor: Any) -> Any:
    """Concatenate tensors from all ranks along dim 0 (first dims may differ)."""
    return _comm().gather(tensor)


def gather_object(obj: Any) -> list[Any]:
    """Gather picklable objects from all ranks (lists are concatenated)."""
    return _comm().gather_object(obj)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduce tensors; ``reduction`` is sum, mean (Accelerate's default here), max or min."""
    return _comm().reduce(tensor, reduction, scale)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copy ``from_process``'s tensors into every rank's tensors, in place."""
    return _comm().broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the list's items on every rank by ``from_process``'s items."""
    return _comm().broadcast_object_list(object_list, from_process)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0,
                         pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size on any rank."""
    return _comm().pad_across_processes(tensor, dim, pad_index, pad_first)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); ``device_specific`` adds the rank.

    Args:
        seed: the seed.
        device_specific: use ``seed + rank`` so that ranks differ.
        deterministic: also ask torch for deterministic algorithms.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if device_specific and dist.is_available() and dist.is_initialized():
        seed += dist.get_rank()
    seed_everything(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)
