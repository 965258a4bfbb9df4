"""Accelerate's ``accelerate.utils.other``: unwrapping models, saving one object, checking the
kernel, and writing the default config file (``patch_environment`` lives in
:mod:`accel.compat.environment`, as in Accelerate, and is re-exported here).

Example:
    >>> import torch
    >>> is_compiled_module(nn.Linear(1, 1))
    False
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn

from .._base.warn import warn_user
from ..checkpoint.storage import _st
from ..checkpoint.storage import files as _ckpt_files
from ..config.settings import parse_mixed_precision
from ..device import DEVICE_KINDS
from ..env.log import get_logger
from ..precision import remove_forward_wrapper
from ..strategy import unwrap_module
from ..strategy.compile import compile_regions, has_compiled_regions, is_compiled_module
from .environment import patch_environment

__all__ = ["check_os_kernel", "compile_regions", "extract_model_from_parallel",
           "get_model_tp_size", "has_compiled_regions", "is_compiled_module",
           "patch_environment", "save", "write_basic_config"]

#: The oldest Linux kernel that Accelerate recommends (older ones can hang processes).
MIN_KERNEL = (5, 5, 0)


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
        >>> net = nn.Linear(1, 1)
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
    from ..launch.config_cmd import default_values
    from ..launch.config_file import default_config_path, write_config

    precision = parse_mixed_precision(mixed_precision).value
    path = Path(save_location).expanduser() if save_location is not None \
        else default_config_path()[0]
    if path.exists():
        warn_user(f"write_basic_config: {path} already exists and was left unchanged; edit "
                  "it with `accel config`, or pass another save_location")
        return False
    return write_config(path, default_values(DEVICE_KINDS["cuda"].count(), precision))


def save(obj: Any, f: str | os.PathLike[str] | IO[bytes], save_on_each_node: bool = False,
         safe_serialization: bool = False) -> None:
    """``torch.save`` for a job: only the main process writes (with ``save_on_each_node``, the
    local main process of every machine, for machines without a shared filesystem).

    Args:
        obj: what to save; with ``safe_serialization`` a dict of tensors (or a module: its
            state dict).
        f: a path (written atomically: a temporary file, fsynced and renamed) or, without
            ``safe_serialization``, an open binary file.
        save_on_each_node: each machine's local main process writes, not only the main process.
        safe_serialization: write safetensors (read back without pickle) rather than
            ``torch.save``'s format. Tensors that share memory (tied weights) are stored once,
            with a warning naming the others: accel's readers give those names back, other
            safetensors readers see only the first.

    The two formats are the ones ``Accelerator.save`` writes (the same code), as in Accelerate;
    keep a ``torch.save`` file to tensors and plain values so that
    ``torch.load(f, weights_only=True)`` reads it.

    Example:
        >>> import os, tempfile, torch
        >>> path = os.path.join(tempfile.mkdtemp(), "extra.pt")
        >>> save({"epoch": 3}, path)
        >>> torch.load(path, weights_only=True)
        {'epoch': 3}
    """
    from .state import PartialState  # the process state (and its group) only once one saves

    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if not isinstance(f, (str, os.PathLike)):
        if safe_serialization:
            raise TypeError("save(..., safe_serialization=True) writes to a path, got "
                            f"{type(f).__name__}; pass the file name instead of an open file")
        torch.save(obj, f)  # an open file: torch.save's format, as Accelerator.save writes it
    elif safe_serialization:
        _report_shared(obj, path=os.fspath(f))
        _ckpt_files.save(obj, Path(f))
    else:
        _ckpt_files.save_torch(obj, Path(f))


def _report_shared(obj: Any, *, path: str) -> None:
    """Log, as Accelerate does, the entries of ``obj`` that share memory with another one (the
    safetensors file stores each such tensor once)."""
    tensors = obj.state_dict() if isinstance(obj, nn.Module) else obj
    if not isinstance(tensors, Mapping):
        return  # files.save says what it takes
    aliases = _st.plan(tensors)[1]
    if aliases:
        pairs = ", ".join(f"{alias} -> {kept}" for alias, kept in sorted(aliases.items()))
        get_logger("accel.utils.other").warning(
            f"Removed shared tensor {sorted(aliases)} while saving {path}: each shares memory "
            f"with another entry ({pairs}) and is stored once. accel's readers "
            "(accel.checkpoint.load, Accelerator.load_model) give the names back from the "
            "file's metadata; other safetensors readers see only the kept name, so re-tie the "
            "weights after loading (e.g. model.tie_weights())")


def check_os_kernel() -> None:
    """Log a warning when this is Linux with a kernel older than 5.5.0, which can make
    processes hang (Accelerate's check; nothing happens on other systems).

    Example:
        >>> check_os_kernel()
    """
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", info.release)
    if found is None:
        return
    if tuple(int(part) for part in found.groups()) < MIN_KERNEL:
        minimum = ".".join(map(str, MIN_KERNEL))
        get_logger("accel.utils.other").warning(
            f"Detected kernel version {found.group(0)}, which is below the recommended minimum "
            f"of {minimum}: processes can hang. Upgrade the kernel to {minimum} or newer.")


def get_model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel degree a ``transformers`` model was sharded with, or None.

    Read from ``model.tp_size`` (``transformers`` < 5), else from
    ``model.config.distributed_config`` (an object or a dict with ``tp_size``; ``transformers``
    >= 5, which leaves ``model.tp_size`` as None).

    Example:
        >>> get_model_tp_size(nn.Linear(1, 1)) is None
        True
    """
    size = getattr(model, "tp_size", None)
    if size is not None:
        return int(size)
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    size = config.get("tp_size") if isinstance(config, Mapping) else \
        getattr(config, "tp_size", None)
    return None if size is None else int(size)
