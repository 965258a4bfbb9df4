"""What Hugging Face Accelerate users import from ``accelerate.utils``.

The submodules carry Accelerate's module paths, so ``from accelerate.utils.operations import
gather`` becomes ``from accel.utils.operations import gather``: ``operations`` (collectives on
torch's default process group; with no group they are the world-size-1 no-ops),
``dataclasses`` (configuration objects), ``imports`` (the ``is_*_available`` probes),
``random`` (seeding) and ``other`` (unwrapping models, environment patches, the default config
file).

Example:
    >>> import torch
    >>> from accel.utils import gather, set_seed
    >>> set_seed(0)
    >>> gather(torch.tensor([1, 2])).tolist()
    [1, 2]
"""

from __future__ import annotations

import importlib
from typing import Any

from .. import availability
from ..availability import *  # noqa: F403 - the is_*_available probes (also in .imports)
from ..config import parse_mixed_precision
from ..data import skip_first_batches
from ..memory import find_executable_batch_size, release_memory
from ..progress import tqdm
from . import dataclasses, imports, operations, other, random
from .dataclasses import *  # noqa: F403 - each submodule's __all__ is re-exported
from .operations import *  # noqa: F403
from .other import *  # noqa: F403
from .random import *  # noqa: F403

__all__ = ["dataclasses", "find_executable_batch_size", "imports", "operations", "other",
           "parse_mixed_precision", "random", "release_memory", "skip_first_batches", "tqdm"]
__all__ += dataclasses.__all__
__all__ += availability.__all__
__all__ += operations.__all__
__all__ += other.__all__
__all__ += random.__all__

#: Accelerate's ``accelerate.utils`` names for big-model placement, offload and loading, imported
#: on first use (they live in accel.big_modeling).
_BIG_MODELING: dict[str, str] = {
    name: "accel.big_modeling.placement" for name in (
        "check_device_map", "clean_device_map", "compute_module_sizes", "find_tied_parameters",
        "get_balanced_memory", "get_max_layer_size", "infer_auto_device_map")
} | {
    name: "accel.big_modeling.structure" for name in (
        "calculate_maximum_sizes", "check_tied_parameters_in_config",
        "check_tied_parameters_on_same_device", "ensure_weights_retied",
        "get_module_children_bottom_up", "retie_parameters")
} | {
    name: "accel.big_modeling.tensors" for name in (
        "align_module_device", "has_offloaded_params", "id_tensor_storage",
        "named_module_tensors", "set_module_tensor_to_device")
} | {
    name: "accel.big_modeling.state_dicts" for name in (
        "clean_state_dict_for_safetensors", "extract_submodules_state_dict",
        "load_offloaded_weights", "load_state_dict")
} | {
    "convert_bytes": "accel.big_modeling.sizes",
    "convert_file_size_to_int": "accel.big_modeling.sizes",
    "dtype_byte_size": "accel.big_modeling.sizes",
    "get_max_memory": "accel.big_modeling.budget",
} | {
    name: "accel.big_modeling.offload" for name in (
        "OffloadedWeightsLoader", "PrefixedDataset", "load_offloaded_weight", "offload_state_dict",
        "offload_weight", "save_offload_index")
} | {
    "load_checkpoint_in_model": "accel.big_modeling.loading",
}
__all__ += sorted(_BIG_MODELING)


def __getattr__(name: str) -> Any:
    module = _BIG_MODELING.get(name)
    if module is None:
        raise AttributeError(f"module 'accel.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
