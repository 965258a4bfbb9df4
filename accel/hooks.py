"""Accelerate's ``accelerate.hooks`` module path: the model hooks of :mod:`accel.big_modeling`.

Example:
    >>> import torch
    >>> from accel.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
    >>> layer = add_hook_to_module(torch.nn.Linear(2, 2), ModelHook())
    >>> hasattr(remove_hook_from_module(layer), "_hf_hook")
    False
"""

from __future__ import annotations

from .big_modeling.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from .big_modeling.tensors import named_module_tensors, set_module_tensor_to_device

__all__ = ["AlignDevicesHook", "CpuOffload", "ModelHook", "SequentialHook", "UserCpuOffloadHook",
           "add_hook_to_module", "named_module_tensors", "remove_hook_from_module",
           "remove_hook_from_submodules", "set_module_tensor_to_device"]
