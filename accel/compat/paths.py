"""Which names each of Accelerate's module paths re-exports, and from where (one table).

accel's root modules that carry Accelerate's module paths (``accel.state``,
``accel.data_loader``, ``accel.utils.operations``, ...) are lazy shims: each asks this module
for a name on first use, so importing a path costs nothing until a name is read, and the
mapping of Accelerate's names lives here rather than in the shims. A name a path does not have
raises at the point of use with the reason and the alternative when accel refuses it (see
:mod:`accel.compat.refusals`), or when another path has it (``accel.utils.other.convert_bytes``
is ``accel.utils.convert_bytes``).

Example:
    >>> from accel.compat.paths import names
    >>> "PartialState" in names("accel.state")
    True
"""

from __future__ import annotations

import importlib
from typing import Any

from .refusals import not_provided, refused_reason, stand_in

__all__ = ["EXTRA", "PATHS", "SUBMODULES", "names", "resolve"]

#: Accelerate module path -> the modules whose ``__all__`` it re-exports (first wins).
PATHS: dict[str, tuple[str, ...]] = {
    "accel.state": ("accel.compat.state",),
    "accel.data_loader": ("accel.compat.data_loader",),
    "accel.checkpointing": ("accel.compat.checkpointing",),
    "accel.local_sgd": ("accel.accelerator.local_sgd",),
    "accel.logging": ("accel.env.log",),
    "accel.hooks": ("accel.big_modeling.hooks",),
    "accel.tracking": ("accel.tracking.trackers",),
    "accel.accelerator": ("accel.compat.accelerator", "accel.accelerator.facade"),
    "accel.utils.operations": ("accel.compat.operations",),
    "accel.utils.other": ("accel.compat.other",),
    "accel.utils.random": ("accel.compat.random",),
    "accel.utils.imports": ("accel.device.availability",),
    "accel.utils.dataclasses": ("accel.compat.dataclasses",),
    "accel.utils.versions": ("accel.compat.versions",),
    "accel.utils.constants": ("accel.compat.constants",),
    "accel.utils.memory": ("accel.run.memory",),
    "accel.utils.bnb": (),  # its names are refused (bitsandbytes quantization)
    "accel.utils.modeling": (),  # names only (EXTRA): accel.big_modeling's, as in Accelerate
    "accel.parallelism_config": (),
    "accel.utils.launch": ("accel.compat.commands_launch",),  # the rest: refused (internal)
    **dict.fromkeys(("accel.commands", "accel.commands.launch", "accel.commands.test",
                     "accel.commands.env", "accel.commands.estimate", "accel.commands.tpu",
                     "accel.commands.to_fsdp2", "accel.commands.merge", "accel.commands.config",
                     "accel.commands.config.config_args"), ()),  # names: EXTRA, or refused
    "accel.utils.environment": ("accel.compat.environment",),
    "accel.utils": ("accel.compat.dataclasses", "accel.device.availability",
                    "accel.compat.operations", "accel.compat.other", "accel.compat.random",
                    "accel.compat.environment"),
}

#: accelerate.utils.modeling's big-model functions, all in accel.big_modeling
_MODELING: dict[str, str] = {
    **dict.fromkeys(("check_device_map", "clean_device_map", "compute_module_sizes",
                     "find_tied_parameters", "get_balanced_memory", "get_max_layer_size",
                     "infer_auto_device_map"), "accel.big_modeling.placement"),
    **dict.fromkeys(("calculate_maximum_sizes", "check_tied_parameters_in_config",
                     "check_tied_parameters_on_same_device", "compute_module_total_buffer_size",
                     "ensure_weights_retied", "get_module_children_bottom_up",
                     "get_non_persistent_buffers", "retie_parameters"),
                    "accel.big_modeling.structure"),
    **dict.fromkeys(("align_module_device", "has_offloaded_params", "id_tensor_storage",
                     "named_module_tensors", "set_module_tensor_to_device"),
                    "accel.big_modeling.tensors"),
    **dict.fromkeys(("clean_state_dict_for_safetensors", "extract_submodules_state_dict",
                     "get_state_dict_offloaded_model", "load_offloaded_weights",
                     "load_state_dict"),
                    "accel.big_modeling.state_dicts"),
    **dict.fromkeys(("convert_file_size_to_int", "dtype_byte_size"), "accel.big_modeling.sizes"),
    "get_max_memory": "accel.big_modeling.budget",
    "load_checkpoint_in_model": "accel.big_modeling.loading",
}

#: Extra single names a path re-exports from a module that is not wholly re-exported.
EXTRA: dict[str, dict[str, str]] = {
    "accel.utils.modeling": _MODELING,
    "accel.parallelism_config": {"ParallelismConfig": "accel.config.parallelism"},
    **{f"accel.commands.{command}": dict.fromkeys(
        (f"{command}_command", f"{command}_command_parser"), "accel.compat.commands")
       for command in ("test", "env")},
    "accel.commands.merge": {"merge_command_parser": "accel.compat.commands"},
    "accel.commands.config": {"config_command_parser": "accel.compat.commands",
                              "load_config_from_file": "accel.compat.commands_config"},
    "accel.commands.launch": {**dict.fromkeys(("launch_command", "launch_command_parser"),
                                              "accel.compat.commands"),
                              "_validate_launch_command": "accel.compat.commands_launch"},
    "accel.commands.estimate": dict.fromkeys(("add_timm_hub_prefix", "estimate_command",
                                              "estimate_command_parser"),
                                             "accel.compat.commands_tools"),
    "accel.commands.tpu": dict.fromkeys(("tpu_command_launcher", "tpu_command_parser"),
                                        "accel.compat.commands_tools"),
    "accel.commands.to_fsdp2": dict.fromkeys(("convert_config_to_fsdp2", "to_fsdp2_command",
                                              "to_fsdp2_command_parser"),
                                             "accel.compat.commands_tools"),
    "accel.commands.config.config_args": dict.fromkeys(
        ("BaseConfig", "ClusterConfig", "load_config_from_file"), "accel.compat.commands_config"),
    "accel.hooks": {"named_module_tensors": "accel.big_modeling.tensors",
                    "set_module_tensor_to_device": "accel.big_modeling.tensors",
                    **dict.fromkeys(("LayerwiseCastingHook", "attach_align_device_hook",
                                     "attach_align_device_hook_on_blocks",
                                     "attach_execution_device_hook"),
                                    "accel.big_modeling.attach")},
    # accelerate.utils also names big-model placement, offload and loading (accel.big_modeling)
    "accel.utils": {
        **_MODELING,
        "convert_bytes": "accel.big_modeling.sizes",
        **dict.fromkeys(("OffloadedWeightsLoader", "PrefixedDataset", "load_offloaded_weight",
                         "offload_state_dict", "offload_weight", "save_offload_index"),
                        "accel.big_modeling.offload"),
        **dict.fromkeys(("compare_versions", "is_torch_version"), "accel.compat.versions"),
        "clear_device_cache": "accel.run.memory",
        "parse_mixed_precision": "accel.config.settings",
        "skip_first_batches": "accel.data",
        "find_executable_batch_size": "accel.run.memory",
        "release_memory": "accel.run.memory",
        "tqdm": "accel.run.progress",
        **dict.fromkeys(("prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env"),
                        "accel.compat.commands_launch"),
    },
}

#: Submodules a path names as attributes (``accel.utils.operations``), imported on first use.
SUBMODULES: dict[str, tuple[str, ...]] = {
    "accel.commands": ("config", "env", "estimate", "launch", "merge", "test", "to_fsdp2", "tpu"),
    "accel.commands.config": ("config_args",),
    "accel.utils": ("constants", "dataclasses", "environment", "imports", "memory", "modeling",
                    "operations", "other", "random", "versions"),
}


def _public(module: Any) -> list[str]:
    return list(getattr(module, "__all__", ()))


def names(path: str) -> list[str]:
    """Every public name ``path`` re-exports (imports its target modules)."""
    found: list[str] = []
    for target in PATHS[path]:
        found += [n for n in _public(importlib.import_module(target)) if n not in found]
    found += [n for n in EXTRA.get(path, {}) if n not in found]
    return found + [n for n in SUBMODULES.get(path, ()) if n not in found]


def resolve(path: str, name: str, namespace: dict[str, Any]) -> Any:
    """The value of ``path.name``, cached in the shim's ``namespace`` (its ``globals()``); a
    name accel refuses is its stand-in, which raises with the reason when used."""
    if name == "__all__":
        value: Any = names(path)
    elif name in SUBMODULES.get(path, ()):
        value = importlib.import_module(f"{path}.{name}")
    elif name in EXTRA.get(path, {}):
        value = getattr(importlib.import_module(EXTRA[path][name]), name)
    else:
        for target in PATHS[path]:
            module = importlib.import_module(target)
            if hasattr(module, name):
                value = getattr(module, name)
                break
        else:
            reason = refused_reason(path, name)
            if reason is None:
                raise _missing(path, name)
            value = stand_in(path, name=name, reason=reason)
    namespace[name] = value
    return value


def _missing(path: str, name: str) -> AttributeError | ImportError:
    """The error for a name ``path`` lacks (and does not refuse): where accel has it."""
    parent = path.rpartition(".")[0]
    if parent in PATHS and not name.startswith("_") and name in names(parent):
        return not_provided(name, f"{path} has no {name!r}: accel provides it as "
                                  f"`{parent}.{name}`; import it from there")
    return AttributeError(f"module {path!r} has no attribute {name!r}")
