"""Place a model over devices, the CPU and disk (Accelerate's ``dispatch_model``,
``cpu_offload``, ``disk_offload``).

A device map names modules (``""`` is the whole model) and where each goes: an accelerator index
or name (``0``, ``"cuda:1"``), ``"cpu"`` or ``"disk"``. Modules on a device are moved there;
modules on ``"cpu"`` while the model runs on an accelerator, and every module on ``"disk"``, are
offloaded: their weights stay in CPU memory or in an offload folder (memory-mapped safetensors)
and visit the execution device for each forward only. The model's output comes back on the device
its input was on.

Example:
    >>> import tempfile, torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    >>> expected = model(torch.ones(1, 3))
    >>> _ = dispatch_model(model, {"0": "cpu", "1": "disk"}, offload_dir=tempfile.mkdtemp())
    >>> model[1].weight.device.type, torch.equal(model(torch.ones(1, 3)), expected)
    ('meta', True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data import send_to_device
from .hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    TiedWeights,
    UserCpuOffloadHook,
    add_hook_to_module,
    as_device,
    named_module_tensors,
    place_tensors,
    remove_hook_from_submodules,
    set_module_tensor,
    storage_key,
)
from .offload import OffloadedWeightsLoader, PrefixedDataset, offload_state_dict, read_offload_index
from .placement import unplaced_tensors

__all__ = ["cpu_offload", "cpu_offload_with_hook", "dispatch_model", "disk_offload"]

DeviceMap = Mapping[str, "int | str | torch.device"]
_OFFLOAD = ("cpu", "disk")


class _ModelIOHook(ModelHook):
    """On the dispatched model: inputs to the main device, the output back to the input's
    device; the tied weights materialised during the forward are dropped at its end."""

    def __init__(self, main_device: torch.device, skip_keys: str | list[str] | None,
                 tied: TiedWeights) -> None:
        self.main_device, self.skip_keys, self.tied = main_device, skip_keys, tied
        self.input_device: torch.device | None = None

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        first = next((t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)), None)
        self.input_device = None if first is None else first.device
        self.tied.clear()
        return (send_to_device(args, self.main_device),
                send_to_device(kwargs, self.main_device, skip_keys=self.skip_keys))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        self.tied.clear()
        if self.input_device is None:
            return output
        return send_to_device(output, self.input_device, skip_keys=self.skip_keys)


def _owner(name: str, names: Sequence[str]) -> str | None:
    """The longest device-map entry that ``name`` (a tensor or module name) lies under."""
    best = None
    for entry in names:
        covers = entry == "" or name == entry or name.startswith(entry + ".")
        if covers and (best is None or len(entry) > len(best)):
            best = entry
    return best


def _check_map(model: nn.Module, device_map: DeviceMap) -> None:
    missing = unplaced_tensors(model, device_map)
    if missing:
        raise ValueError(f"the device map leaves {len(missing)} tensor(s) unplaced: "
                         f"{missing[:10]}; add their modules to device_map (e.g. "
                         f"{missing[0].rpartition('.')[0]!r}: 'cpu')")
    known = {name for name, _ in model.named_modules()}
    known |= {name for name, _ in named_module_tensors(model, recurse=True)}
    unknown = [name for name in device_map if name not in known]
    if unknown:
        raise ValueError(f"the device map names {unknown[:10]}, which are not modules or tensors "
                         f"of {type(model).__name__}; use names from model.named_modules()")


def _main_device(device_map: DeviceMap, main_device: Any) -> torch.device:
    if main_device is not None:
        return as_device(main_device)
    devices = [d for d in device_map.values() if str(d) not in _OFFLOAD]
    return as_device(devices[0]) if devices else torch.device("cpu")


def _offloaded_state(model: nn.Module, *, names: Sequence[str], main: torch.device,
                     device_map: DeviceMap, offload_buffers: bool
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The weights of the modules kept on the CPU (for a model running elsewhere) and of those
    on disk, by full name (buffers only with ``offload_buffers``; never meta tensors)."""
    cpu: dict[str, torch.Tensor] = {}
    disk: dict[str, torch.Tensor] = {}
    for name, tensor in named_module_tensors(model, include_buffers=offload_buffers,
                                             recurse=True, remove_non_persistent=True):
        where = str(device_map[_owner(name, names) or ""])
        if where == "disk" and not tensor.is_meta:
            disk[name] = tensor
        elif where == "cpu" and main != torch.device("cpu") and not tensor.is_meta:
            cpu[name] = tensor.detach().to("cpu")
    return cpu, disk


def _weights(model: nn.Module, *, device_map: DeviceMap, main: torch.device, opts: dict[str, Any]
             ) -> OffloadedWeightsLoader | None:
    names = list(device_map)
    cpu, disk = _offloaded_state(model, names=names, main=main, device_map=device_map,
                                 offload_buffers=opts["offload_buffers"])
    if opts["state_dict"] is not None:
        cpu = dict(opts["state_dict"])
    folder, index = opts["offload_dir"], opts["offload_index"]
    if disk and index is None:
        if folder is None:
            raise ValueError("the device map puts modules on 'disk' but no offload_dir was "
                             "given; pass offload_dir='some/folder' (it is created)")
        there = read_offload_index(folder)  # e.g. written by load_checkpoint_in_model
        offload_state_dict(folder, {k: v for k, v in disk.items() if k not in there})
    if not cpu and not index and "disk" not in map(str, device_map.values()):
        return None
    if "disk" in map(str, device_map.values()) and folder is None:
        raise ValueError("the device map puts modules on 'disk': pass offload_dir (the folder "
                         "that holds their offloaded weights)")
    return OffloadedWeightsLoader(state_dict=cpu, save_folder=folder, index=index)


def _share_ties(loader: OffloadedWeightsLoader | None, tied: TiedWeights) -> None:
    if loader is None:
        return
    seen: dict[str, int] = {}
    for name in loader:
        key = loader.canonical(name)
        seen[key] = seen.get(key, 0) + 1
    tied.shared = {key for key, count in seen.items() if count > 1}


def dispatch_model(model: nn.Module, device_map: DeviceMap,
                   main_device: torch.device | str | int | None = None,
                   state_dict: Mapping[str, torch.Tensor] | None = None,
                   offload_dir: str | Path | None = None,
                   offload_index: Mapping[str, Any] | None = None, offload_buffers: bool = False,
                   skip_keys: str | list[str] | None = None,
                   preload_module_classes: list[str] | None = None,
                   force_hooks: bool = False) -> nn.Module:
    """Place ``model``'s modules as ``device_map`` says and hook them to run there.

    Args:
        model: the model (its weights loaded, except for modules already offloaded to
            ``offload_dir`` with ``offload_index``).
        device_map: module name -> ``0``/``"cuda:0"``-style device, ``"cpu"`` or ``"disk"``.
        main_device: where the forward starts (default: the first accelerator of the map, else
            the CPU); ``"cpu"`` modules are offloaded to CPU memory when it is an accelerator.
        state_dict: the CPU-offloaded weights (default: taken from the model).
        offload_dir: folder for the ``"disk"`` modules' weights (written unless
            ``offload_index`` says they are there already).
        offload_index: the offload folder's index (see ``offload_state_dict``).
        offload_buffers: offload buffers too (default: they stay on the execution device).
        skip_keys: keys of dict inputs and outputs that are not moved between devices.
        preload_module_classes: class names whose instances load all their weights at once
            (for modules that use a submodule's weights without calling it); otherwise each
            offloaded module with weights of its own loads them for its own forward.
        force_hooks: hook the model even when it fits one device.

    Raises:
        ValueError: a tensor no entry covers, or an entry that names nothing (both named).
    """
    _check_map(model, device_map)
    main = _main_device(device_map, main_device)
    devices = {str(d) for d in device_map.values()}
    if len(devices) == 1 and "disk" not in devices and not force_hooks:
        only = next(iter(device_map.values()))
        place_tensors(model, as_device(only), recurse=True, memo={})
        model.__dict__["hf_device_map"] = dict(device_map)
        return model
    opts = {"offload_buffers": offload_buffers, "state_dict": state_dict,
            "offload_dir": offload_dir, "offload_index": offload_index, "skip_keys": skip_keys,
            "preload": list(preload_module_classes or [])}
    loader = _weights(model, device_map=device_map, main=main, opts=opts)
    tied = TiedWeights()
    _share_ties(loader, tied)
    _attach(model, device_map=device_map, main=main, loader=loader, tied=tied, opts=opts)
    if "" not in device_map:
        add_hook_to_module(model, _ModelIOHook(main, skip_keys, tied), append=True)
    model.__dict__["hf_device_map"] = dict(device_map)
    return model


def _attach(model: nn.Module, *, device_map: DeviceMap, main: torch.device,
            loader: OffloadedWeightsLoader | None, tied: TiedWeights, opts: dict[str, Any]
            ) -> None:
    """Hooks for every device-map entry: placing it, or offloading it (run on ``main``)."""
    def offloaded_entry(name: str) -> bool:
        where = str(device_map[name])
        return where == "disk" or (where == "cpu" and main != torch.device("cpu"))

    modules = dict(model.named_modules())
    skip, preload = opts["skip_keys"], opts["preload"]
    # placed entries first: an offloaded weight tied to a placed one then uses that one
    for name in sorted(device_map, key=lambda n: (offloaded_entry(n), len(n))):
        module = modules.get(name)
        if offloaded_entry(name):
            if module is None:  # a tensor named directly: it stays with the execution device
                _place_one(model, name=name, device=main, tied=tied)
                continue
            _hook_tree(module, prefix=name, preload=preload, make=lambda prefix,
                       whole: AlignDevicesHook(
                execution_device=main, offload=True, offload_buffers=opts["offload_buffers"],
                weights_map=None if loader is None else PrefixedDataset(
                    loader, f"{prefix}." if prefix else ""),
                place_submodules=whole, skip_keys=skip, tied_params_map=tied))
            continue
        device = as_device(device_map[name])
        if module is None:
            _place_one(model, name=name, device=device, tied=tied)
            continue
        add_hook_to_module(module, AlignDevicesHook(
            execution_device=device, place_submodules=True, skip_keys=skip, tied_params_map=tied))
        follow = _follower(device, skip=skip, tied=tied)
        for child_name, child in module.named_children():  # inputs follow into every part
            _hook_tree(child, prefix=child_name, preload=preload, make=follow)


def _follower(device: torch.device, *, skip: str | list[str] | None,
              tied: TiedWeights) -> Callable[[str, bool], ModelHook]:
    """A maker of hooks that move a placed part's inputs to its device (its tensors are
    there)."""
    def make(_name: str, whole: bool) -> ModelHook:
        return AlignDevicesHook(execution_device=device, place_submodules=whole, skip_keys=skip,
                                tied_params_map=tied)
    return make


def _hook_tree(module: nn.Module, *, prefix: str, preload: Sequence[str],
               make: Callable[[str, bool], ModelHook], append_root: bool = False) -> None:
    """``make(name, whole)``'s hook on every module under ``module`` that holds tensors of its
    own; an instance of a ``preload`` class gets one hook for all of its tensors (``whole``)."""
    stack = [(prefix, module)]
    while stack:
        name, current = stack.pop()
        whole = type(current).__name__ in preload
        if whole or next(named_module_tensors(current), None) is not None:
            add_hook_to_module(current, make(name, whole),
                               append=append_root and current is module)
        if not whole:
            stack.extend((f"{name}.{child}" if name else child, sub)
                         for child, sub in current.named_children())


def _place_one(model: nn.Module, *, name: str, device: torch.device, tied: TiedWeights) -> None:
    tensor = dict(named_module_tensors(model, recurse=True))[name]
    placed = tied.placed.get(id(tensor))
    if placed is None:
        data = tensor.detach().to(device)
        placed = nn.Parameter(data, tensor.requires_grad) \
            if isinstance(tensor, nn.Parameter) else data
        tied.placed[id(tensor)] = placed
    set_module_tensor(model, name, placed)


def cpu_offload(model: nn.Module, execution_device: torch.device | str | int | None = None,
                offload_buffers: bool = False,
                state_dict: Mapping[str, torch.Tensor] | None = None,
                preload_module_classes: list[str] | None = None) -> nn.Module:
    """Keep ``model``'s weights in CPU memory and run each module on ``execution_device``.

    Every module with weights of its own gets an offloading hook; its weights visit the execution
    device for its forward only. :func:`~accel.big_modeling.remove_hook_from_module` with
    ``recurse=True`` restores the model.

    Example:
        >>> import torch
        >>> model = cpu_offload(torch.nn.Sequential(torch.nn.Linear(2, 2)), "cpu")
        >>> model[0].weight.is_meta, model(torch.ones(1, 2)).shape
        (True, torch.Size([1, 2]))
    """
    device = as_device(execution_device if execution_device is not None else "cpu")
    loader = None if state_dict is None else OffloadedWeightsLoader(state_dict=state_dict)
    return _offload_leaves(model, device=device, loader=loader, offload_buffers=offload_buffers,
                           preload=preload_module_classes or [])


def cpu_offload_with_hook(model: nn.Module,
                          execution_device: torch.device | str | int | None = None,
                          prev_module_hook: UserCpuOffloadHook | None = None
                          ) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keep ``model`` on the CPU until its forward, then on ``execution_device`` until
    ``hook.offload()`` (called for you by the next model's hook given ``prev_module_hook``):
    whole models move at once, for pipelines that run several models in turn.

    Example:
        >>> import torch
        >>> first, hook = cpu_offload_with_hook(torch.nn.Linear(2, 2), "cpu")
        >>> second, _ = cpu_offload_with_hook(torch.nn.Linear(2, 2), "cpu", prev_module_hook=hook)
        >>> second(first(torch.ones(1, 2))).shape
        torch.Size([1, 2])
    """
    hook = CpuOffload(execution_device, prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(model: nn.Module, offload_dir: str | Path,
                 execution_device: torch.device | str | int | None = None,
                 offload_buffers: bool = False,
                 preload_module_classes: list[str] | None = None) -> nn.Module:
    """Write ``model``'s weights to ``offload_dir`` (memory-mapped safetensors) and run each
    module on ``execution_device`` with its weights read from there for its forward only.

    An ``offload_dir`` that already holds an index is used as it is (nothing is written).
    """
    device = as_device(execution_device if execution_device is not None else "cpu")
    folder = Path(offload_dir)
    if not (folder / "index.json").is_file():
        state = dict(named_module_tensors(model, include_buffers=offload_buffers, recurse=True,
                                          remove_non_persistent=True))
        offload_state_dict(folder, state)
    return _offload_leaves(model, device=device, loader=OffloadedWeightsLoader(save_folder=folder),
                           offload_buffers=offload_buffers, preload=preload_module_classes or [])


def _offload_leaves(model: nn.Module, *, device: torch.device,
                    loader: OffloadedWeightsLoader | None, offload_buffers: bool,
                    preload: Sequence[str]) -> nn.Module:
    """One offloading hook per module with tensors of its own. Without ``loader`` each hook
    keeps its module's CPU tensors (no copy; they come back as they were on removal)."""
    remove_hook_from_submodules(model)
    tied = TiedWeights()
    if loader is None:
        keys = [storage_key(t) for _, t in named_module_tensors(
            model, include_buffers=offload_buffers, recurse=True, remove_non_persistent=True)]
        tied.shared = {key for key in keys if keys.count(key) > 1}
    else:
        _share_ties(loader, tied)
    # the root's input/output hook first: it sees the input where the caller put it
    add_hook_to_module(model, _ModelIOHook(device, None, tied))
    _hook_tree(model, prefix="", preload=preload, make=lambda name, whole: AlignDevicesHook(
        execution_device=device, offload=True, offload_buffers=offload_buffers,
        weights_map=None if loader is None else PrefixedDataset(
            loader, f"{name}." if name else ""),
        place_submodules=whole, tied_params_map=tied), append_root=True)
    return model
