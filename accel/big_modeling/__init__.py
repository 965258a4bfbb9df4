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

from .attach import (
    LayerwiseCastingHook,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    attach_layerwise_casting_hooks,
)
from .budget import get_max_memory
from .dispatch import cpu_offload, cpu_offload_with_hook, disk_offload, dispatch_model
from .empty import init_empty_weights, init_on_device
from .hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from .loading import load_checkpoint_and_dispatch, load_checkpoint_in_model
from .offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
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
from .state_dicts import extract_submodules_state_dict
from .structure import (
    _refuse_recurrent_layers_under_sequence_parallelism as _refuse_recurrent_layers_under_sequence_parallelism,  # noqa: E501
)
from .structure import retie_parameters

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "LayerwiseCastingHook",
    "ModelHook",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "attach_layerwise_casting_hooks",
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "convert_file_size_to_int",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "dtype_byte_size",
    "extract_submodules_state_dict",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "load_offloaded_weight",
    "offload_state_dict",
    "offload_weight",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "retie_parameters",
    "save_offload_index",
]
