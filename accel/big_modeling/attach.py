"""Hooks attached module by module (Accelerate's ``attach_*`` functions of ``accelerate.hooks``).

:func:`attach_align_device_hook` puts an :class:`~accel.big_modeling.hooks.AlignDevicesHook` on
every module that holds tensors of its own, so each layer's weights are on the execution device
(or materialised from ``weights_map``, with ``offload=True``) only for its own forward.
:func:`attach_execution_device_hook` only sets the execution device of modules not hooked yet.
:func:`attach_align_device_hook_on_blocks` does either per block of a ``{name: device}`` map.
:func:`attach_layerwise_casting_hooks` keeps layers' weights in a storage dtype between forwards.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    >>> attach_align_device_hook(model, execution_device="cpu", offload=True)
    >>> model[0].weight.device.type, model(torch.ones(1, 2)).shape
    ('meta', torch.Size([1, 1]))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .hooks import AlignDevicesHook, ModelHook, TiedWeights, add_hook_to_module
from .offload import PrefixedDataset

__all__ = ["LayerwiseCastingHook", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
           "attach_align_device_hook", "attach_align_device_hook_on_blocks",
           "attach_execution_device_hook", "attach_layerwise_casting_hooks"]

Device = torch.device | str | int

#: layers whose weights layerwise casting keeps in the storage dtype between uses
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING: tuple[type[nn.Module], ...] = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
    nn.Linear)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def attach_execution_device_hook(module: nn.Module, execution_device: Device | None,
                                 skip_keys: str | list[str] | None = None,
                                 preload_module_classes: list[str] | None = None,
                                 tied_params_map: TiedWeights | None = None) -> None:
    """An :class:`AlignDevicesHook` running on ``execution_device`` on ``module`` and each
    submodule that has tensors and no hook yet; the recursion stops below a module whose class
    name is in ``preload_module_classes``."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(module, AlignDevicesHook(execution_device, skip_keys=skip_keys,
                                                    tied_params_map=tied_params_map))
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys=skip_keys,
                                     preload_module_classes=preload_module_classes,
                                     tied_params_map=tied_params_map)


def attach_align_device_hook(module: nn.Module, execution_device: Device | None = None,
                             offload: bool = False,
                             weights_map: Mapping[str, torch.Tensor] | None = None,
                             offload_buffers: bool = False, module_name: str = "",
                             skip_keys: str | list[str] | None = None,
                             preload_module_classes: list[str] | None = None,
                             tied_params_map: TiedWeights | None = None) -> None:
    """An :class:`AlignDevicesHook` on every module with tensors of its own (appended to any hook
    it has). ``weights_map`` holds the whole model's tensors by full name (``module_name`` is
    this module's); a module whose class name is in ``preload_module_classes`` gets one hook
    for its whole subtree (with ``offload=True``)."""
    whole = offload and preload_module_classes is not None \
        and type(module).__name__ in preload_module_classes
    has_own = next(iter(module.parameters(recurse=False)), None) is not None \
        or next(iter(module.buffers(recurse=False)), None) is not None
    if has_own or whole:
        prefixed = None if weights_map is None else \
            PrefixedDataset(weights_map, f"{module_name}." if module_name else "")
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=execution_device, offload=offload, weights_map=prefixed,
            offload_buffers=offload_buffers, place_submodules=whole, skip_keys=skip_keys,
            tied_params_map=tied_params_map), append=True)
    if whole:
        return
    for name, child in module.named_children():
        attach_align_device_hook(child, execution_device=execution_device, offload=offload,
                                 weights_map=weights_map, offload_buffers=offload_buffers,
                                 module_name=_join(module_name, name), skip_keys=skip_keys,
                                 preload_module_classes=preload_module_classes,
                                 tied_params_map=tied_params_map)


def _block_hooks(module: nn.Module, *, device: Device | None, offload: bool, name: str,
                 opts: dict[str, Any]) -> None:
    """The hooks of one block of :func:`attach_align_device_hook_on_blocks`."""
    skip, tied = opts["skip_keys"], opts["tied_params_map"]
    if not offload:
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=device, offload_buffers=opts["offload_buffers"],
            io_same_device=name == "", place_submodules=True, skip_keys=skip,
            tied_params_map=tied))
        attach_execution_device_hook(module, device, skip_keys=skip, tied_params_map=tied)
        return
    attach_align_device_hook(module, execution_device=device, offload=True, module_name=name,
                             **opts)
    if not hasattr(module, "_hf_hook"):
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=device, io_same_device=name == "", skip_keys=skip,
            tied_params_map=tied))
    attach_execution_device_hook(module, device, skip_keys=skip, tied_params_map=tied,
                                 preload_module_classes=opts["preload_module_classes"])


def attach_align_device_hook_on_blocks(
        module: nn.Module, execution_device: Device | Mapping[str, Device | None] | None = None,
        offload: bool | Mapping[str, bool] = False,
        weights_map: Mapping[str, torch.Tensor] | None = None, offload_buffers: bool = False,
        module_name: str = "", skip_keys: str | list[str] | None = None,
        preload_module_classes: list[str] | None = None,
        tied_params_map: TiedWeights | None = None) -> None:
    """Hooks per block: ``execution_device`` and ``offload`` are one value for the whole module
    or ``{block name: value}`` maps; an offloaded block gets :func:`attach_align_device_hook`,
    another one hook placing its whole subtree on its device."""
    opts: dict[str, Any] = {"weights_map": weights_map, "offload_buffers": offload_buffers,
                            "skip_keys": skip_keys, "tied_params_map": tied_params_map,
                            "preload_module_classes": preload_module_classes}
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if offload:
            attach_align_device_hook(module, execution_device=execution_device, offload=True,
                                     module_name=module_name, **{**opts,
                                                                 "preload_module_classes": None})
        else:
            add_hook_to_module(module, AlignDevicesHook(
                execution_device=execution_device, io_same_device=True, skip_keys=skip_keys,
                place_submodules=True, tied_params_map=tied_params_map))
        return
    devices = execution_device if isinstance(execution_device, Mapping) else \
        dict.fromkeys(offload, execution_device)  # type: ignore[arg-type]  # offload is a map
    offloads = offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    if module_name in devices and module_name in offloads:
        _block_hooks(module, device=devices[module_name], offload=offloads[module_name],
                     name=module_name, opts=opts)
    elif module_name == "":
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=devices.get(""), io_same_device=True, skip_keys=skip_keys,
            tied_params_map=tied_params_map))
    for name, child in module.named_children():
        attach_align_device_hook_on_blocks(child, execution_device=devices, offload=offloads,
                                           module_name=_join(module_name, name), **opts)


class LayerwiseCastingHook(ModelHook):
    """The module's tensors in ``storage_dtype`` between forwards and in ``compute_dtype`` during
    its forward (less memory, at some loss of precision)."""

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                 non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype,
                                   compute_dtype: torch.dtype,
                                   skip_modules_pattern: str | tuple[str, ...] | None = None,
                                   skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
                                   non_blocking: bool = False) -> None:
    """A :class:`LayerwiseCastingHook` on each layer of ``module`` that is one of
    :data:`SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING`, except the modules whose dotted name matches
    a regular expression of ``skip_modules_pattern`` (``re.search``) or whose class is in
    ``skip_modules_classes`` (and their submodules)."""
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) \
        else tuple(skip_modules_pattern or ())
    skip_classes = tuple(skip_modules_classes or ())
    hook_args: dict[str, Any] = {"storage_dtype": storage_dtype, "compute_dtype": compute_dtype,
                 "non_blocking": non_blocking}
    pending: list[tuple[str, nn.Module]] = [("", module)]
    while pending:
        name, current = pending.pop()
        if isinstance(current, skip_classes) or any(re.search(p, name) for p in patterns):
            continue
        if isinstance(current, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(current, LayerwiseCastingHook(**hook_args), append=True)
            continue
        pending += [(_join(name, child), sub) for child, sub in current.named_children()]
