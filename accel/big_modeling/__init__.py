"""Big-model loading and inference (Accelerate's ``accelerate.big_modeling`` names).

Example:
    >>> from accel.big_modeling import init_empty_weights
    >>> import torch
    >>> with init_empty_weights():
    ...     layer = torch.nn.Linear(4, 4)
    >>> layer.weight.device.type
    'meta'
"""

from __future__ import annotations

from .budget import get_max_memory
from .empty import init_empty_weights, init_on_device
from .placement import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    infer_auto_device_map,
)
from .sizes import convert_file_size_to_int, dtype_byte_size

__all__ = [
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
]
