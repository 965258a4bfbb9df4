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

import contextlib
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import env, rng
from .availability import (
    is_aim_available,
    is_bf16_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_dvclive_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mps_available,
    is_pandas_available,
    is_peft_available,
    is_rich_available,
    is_safetensors_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_torchvision_available,
    is_tqdm_available,
    is_trackio_available,
    is_transformers_available,
    is_wandb_available,
)
from .config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    PrecisionType,
    ProjectConfiguration,
    parse_mixed_precision,
)
from .data import send_to_device, skip_first_batches
from .device import DEVICE_KINDS
from .distributed import Communicator, ProcessContext, build_context
from .dynamo import (
    DynamoBackend,
    TorchDynamoPlugin,
    compile_regions,
    has_compiled_regions,
    is_compiled_module,
)
from .memory import find_executable_batch_size, release_memory
from .precision import remove_forward_wrapper
from .progress import tqdm
from .rng import seed_everything
from .strategy import unwrap_module

__all__ = [
    "AutocastKwargs", "DDPCommunicationHookType", "DataLoaderConfiguration",
    "DistributedDataParallelKwargs", "DistributedType", "DynamoBackend", "GradScalerKwargs",
    "GradientAccumulationPlugin", "InitProcessGroupKwargs", "PrecisionType",
    "ProjectConfiguration", "TorchDynamoPlugin", "broadcast", "broadcast_object_list",
    "compile_regions", "extract_model_from_parallel", "find_executable_batch_size", "gather",
    "gather_object", "has_compiled_regions", "is_aim_available",
    "is_bf16_available", "is_clearml_available", "is_comet_ml_available", "is_compiled_module",
    "is_cuda_available", "is_datasets_available", "is_dvclive_available",
    "is_matplotlib_available", "is_mlflow_available", "is_mps_available", "is_pandas_available",
    "is_peft_available", "is_rich_available", "is_safetensors_available", "is_swanlab_available",
    "is_tensorboard_available", "is_torch_xla_available", "is_torchvision_available",
    "is_tqdm_available", "is_trackio_available", "is_transformers_available",
    "is_wandb_available", "pad_across_processes", "patch_environment", "reduce",
    "release_memory", "send_to_device", "set_seed", "skip_first_batches",
    "synchronize_rng_state", "synchronize_rng_states", "tqdm", "wait_for_everyone",
    "write_basic_config",
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


def wait_for_everyone() -> None:
    """Barrier: every rank waits here until all have arrived (a no-op without a process group).

    Every rank must reach the call, or the others wait forever.
    """
    _comm().barrier()


def synchronize_rng_states(rng_types: Iterable[str], generator: torch.Generator | None = None
                           ) -> None:
    """Copy rank 0's state of each named generator to every rank.

    Args:
        rng_types: some of ``"torch"`` (CPU), ``"cuda"``, ``"xla"`` and ``"generator"``.
        generator: the generator that ``"generator"`` means.

    Example:
        >>> synchronize_rng_states(["torch"])  # one process: nothing to copy
    """
    rng.synchronize(rng_types, _comm(), generator)


def synchronize_rng_state(rng_type: str, generator: torch.Generator | None = None) -> None:
    """:func:`synchronize_rng_states` for one generator."""
    rng.synchronize([rng_type], _comm(), generator)


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables for the block (names upper-cased, values ``str()``-ed), then
    restore what was there before, also when the block raises.

    Example:
        >>> import os
        >>> with patch_environment(accel_doc_example=1):
        ...     os.environ["ACCEL_DOC_EXAMPLE"]
        '1'
        >>> "ACCEL_DOC_EXAMPLE" in os.environ
        False
    """
    with env.patched({name.upper(): str(value) for name, value in kwargs.items()}):
        yield


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True,
                                keep_torch_compile: bool = True) -> nn.Module:
    """The user's model inside the DDP (and, unless kept, ``torch.compile``) wrappers.

    Args:
        model: a model returned by ``prepare()``, possibly compiled.
        keep_fp32_wrapper: False also removes the mixed-precision forward wrapper.
        keep_torch_compile: a compiled model comes back compiled: ``torch.compile(module)``
            rather than ``torch.compile(DDP(module))`` (then a new wrapper with the same
            settings; the one being trained is left as it is).

    Example:
        >>> net = torch.nn.Linear(1, 1)
        >>> extract_model_from_parallel(net) is net
        True
    """
    inner = unwrap_module(model)
    result = unwrap_module(model, keep_torch_compile=True) if keep_torch_compile else inner
    if not keep_fp32_wrapper:
        for module in {id(result): result, id(inner): inner}.values():
            remove_forward_wrapper(module)
    return result


def write_basic_config(mixed_precision: str = "no",
                       save_location: str | os.PathLike[str] | None = None) -> Path | bool:
    """Write the config file that ``accel config default`` writes (Accelerate's keys, so both
    tools read it): one machine, every visible GPU, else one CPU process.

    Args:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        save_location: where to write; by default where ``accel launch`` looks
            (``$ACCEL_CONFIG_FILE``, else ``~/.config/accel/default_config.yaml``).

    Returns:
        The path written, or False (with a warning) when the file exists already: it is never
        overwritten (as in Accelerate).
    """
    # launch/ is the side layer: imported lazily here so that `accel config default` and this
    # function share one writer (tests/unit/test_architecture.py, SIDE_USERS, says why).
    from .launch.config_cmd import default_values
    from .launch.config_file import default_config_path, write_config

    precision = parse_mixed_precision(mixed_precision).value
    path = Path(save_location).expanduser() if save_location is not None \
        else default_config_path()[0]
    if path.exists():
        warnings.warn(f"write_basic_config: {path} already exists and was left unchanged; edit "
                      "it with `accel config`, or pass another save_location", stacklevel=2)
        return False
    return write_config(path, default_values(DEVICE_KINDS["cuda"].count(), precision))
