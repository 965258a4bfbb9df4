"""State dicts for big models (Accelerate's ``load_state_dict``, ``load_offloaded_weights``,
``extract_submodules_state_dict`` and ``clean_state_dict_for_safetensors``).

Files are safetensors only: nothing is unpickled (a ``torch.save`` file is refused with how to
convert it).

Example:
    >>> import torch
    >>> state = {"a.weight": torch.ones(1), "ab.weight": torch.ones(1), "a.b.bias": torch.ones(1)}
    >>> sorted(extract_submodules_state_dict(state, ["a"]))
    ['a.b.bias', 'a.weight']
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._base.warn import warn_user
from ..checkpoint.storage import load
from .hooks import as_device
from .offload import load_offloaded_weight
from .tensors import (
    align_module_device,
    has_offloaded_params,
    id_tensor_storage,
    set_module_tensor_to_device,
)

__all__ = ["clean_state_dict_for_safetensors", "extract_submodules_state_dict",
           "get_state_dict_offloaded_model", "load_offloaded_weights", "load_state_dict"]


def _within(name: str, prefix: str) -> bool:
    return prefix == "" or name == prefix or name.startswith(prefix + ".")


def extract_submodules_state_dict(state_dict: Mapping[str, torch.Tensor],
                                  submodule_names: list[str]) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` that belong to the submodules ``submodule_names`` (``"h.1"``
    takes ``"h.1.weight"``, not ``"h.10.weight"``)."""
    result: dict[str, torch.Tensor] = {}
    for module_name in submodule_names:
        result.update({key: value for key, value in state_dict.items()
                       if key == module_name or key.startswith(module_name + ".")})
    return result


def _target(name: str, device_map: Mapping[str, Any]) -> torch.device:
    """The device of the most specific ``device_map`` entry holding ``name`` (disk: the CPU)."""
    best: tuple[int, Any] = (-1, "cpu")
    for prefix, device in device_map.items():
        if _within(name, prefix) and len(prefix) > best[0]:
            best = (len(prefix), device)
    return as_device("cpu" if str(best[1]) == "disk" else best[1])


def load_state_dict(checkpoint_file: str | Path, device_map: Mapping[str, Any] | None = None
                    ) -> dict[str, torch.Tensor]:
    """Read the safetensors file ``checkpoint_file`` into a state dict.

    Args:
        device_map: module name -> device (as for ``dispatch_model``): each tensor goes to the
            device of the module holding it; tensors of no listed module, and those of ``"disk"``
            modules, stay on the CPU. None: everything on the CPU.

    Raises:
        CheckpointError: not a safetensors file (a pickle file is refused, with how to convert).
    """
    state = load(checkpoint_file)
    if not device_map:
        return state
    placed: dict[int, torch.Tensor] = {}  # tied names (aliases) stay one tensor
    result: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if id(tensor) not in placed:
            placed[id(tensor)] = tensor.to(_target(name, device_map))
        result[name] = placed[id(tensor)]
    return result


def load_offloaded_weights(model: nn.Module, index: Mapping[str, Mapping[str, Any]] | None,
                           offload_folder: str | Path) -> None:
    """Put every weight of the offload folder's ``index`` into ``model``, on the CPU.

    ``index`` is what :func:`~accel.big_modeling.offload_state_dict` (or ``offload_weight``)
    returned, or the folder's ``index.json``; folders Accelerate wrote (one raw ``NAME.dat``
    file per weight) are read too.
    """
    if not index:
        return
    folder = Path(offload_folder)
    for name, entry in index.items():
        if "SCB" in name:  # bitsandbytes statistics: stored next to their weight
            continue
        stats = None
        scb = name.replace("weight", "SCB")
        if "weight" in name and scb in index:
            stats = _read_entry(folder, scb, index[scb])
        set_module_tensor_to_device(model, name, "cpu", value=_read_entry(folder, name, entry),
                                    fp16_statistics=stats)


def _read_entry(folder: Path, name: str, entry: Mapping[str, Any]) -> torch.Tensor:
    file = folder / str(entry.get("file", f"{name}.dat"))
    if not file.is_file():
        raise FileNotFoundError(f"offloaded weight {name!r} should be in {file}, which does not "
                                "exist; offload the model again into this folder")
    return load_offloaded_weight(file, {**entry, "offset": entry.get("offset", 0)})


def clean_state_dict_for_safetensors(state_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """``state_dict`` ready for safetensors: of several entries sharing one storage (tied
    weights) only the first is kept (the others are deleted from ``state_dict``, with a warning),
    and tensors are made contiguous. Non-tensor entries are kept as they are.

    Example:
        >>> import warnings
        >>> import torch
        >>> weight = torch.ones(2)
        >>> with warnings.catch_warnings(record=True):
        ...     sorted(clean_state_dict_for_safetensors({"a": weight, "b": weight}))
        ['a']
    """
    groups: dict[tuple[torch.device, int, int], list[str]] = {}
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor):
            groups.setdefault(id_tensor_storage(value), []).append(name)
    removed = [name for names in groups.values() for name in names[1:]]
    for name in removed:
        del state_dict[name]
    if removed:
        warn_user(f"removed {sorted(removed)} from the state dict: they share memory with "
                  "another entry (tied weights). Re-tie them after loading (e.g. "
                  "model.tie_weights()) or they keep the values they were initialised with")
    return {name: value.contiguous() if isinstance(value, torch.Tensor) else value
            for name, value in state_dict.items()}


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with the weights of offloaded modules (see
    :func:`~accel.big_modeling.cpu_offload`, :func:`~accel.big_modeling.disk_offload`) read
    back, one module at a time, on the CPU; the offloaded model stays offloaded.

    Raises:
        ValueError: tensors that are on the ``meta`` device and held by no offload hook.

    Example:
        >>> from accel.big_modeling import cpu_offload
        >>> layer = torch.nn.Linear(2, 2)
        >>> _ = cpu_offload(layer)
        >>> get_state_dict_offloaded_model(layer)["weight"].device.type
        'cpu'
    """
    state: dict[str, torch.Tensor] = dict(model.state_dict())
    for name, module in model.named_modules():
        if not has_offloaded_params(module):
            continue
        with align_module_device(module, "cpu"):
            for key, value in module.state_dict().items():
                full = f"{name}.{key}" if name else key
                if not value.is_meta and state[full].is_meta:
                    state[full] = value.detach().to("cpu")
    missing = [key for key, value in state.items() if value.is_meta]
    if missing:
        raise ValueError(f"{missing} are on the meta device and no offload hook holds their "
                         "weights; load them first (load_checkpoint_in_model)")
    return state
