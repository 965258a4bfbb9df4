"""Put one tensor of a module somewhere (Accelerate's ``set_module_tensor_to_device`` and the
helpers transformers, diffusers and peft loaders call around it).

:func:`set_module_tensor_to_device` replaces the parameter or buffer ``tensor_name`` of a module
by its value on ``device``: ``param.to(device)`` would give a new tensor the module does not see.
A parameter stays a parameter of the same class with the same ``requires_grad``. With ``value``
(the way out of the ``meta`` device) the value is cast to ``dtype``, or to the current tensor's
dtype when ``dtype`` is None (as ``nn.Module.load_state_dict`` does); integer and bool values
ignore ``dtype``. Without ``value``, ``dtype`` applies only to a move onto ``meta``.

Example:
    >>> import torch
    >>> from accel.big_modeling import init_empty_weights
    >>> with init_empty_weights():
    ...     layer = torch.nn.Linear(2, 2)
    >>> half = torch.ones(2, 2, dtype=torch.half)
    >>> set_module_tensor_to_device(layer, "weight", "cpu", value=half)
    >>> layer.weight.device.type, layer.weight.dtype, type(layer.weight).__name__
    ('cpu', torch.float32, 'Parameter')
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..run.memory import clear_device_cache
from . import hooks
from .hooks import AlignDevicesHook, as_device
from .sizes import parse_dtype

__all__ = ["align_module_device", "has_offloaded_params", "id_tensor_storage",
           "named_module_tensors", "set_module_tensor_to_device"]

#: Accelerate's ``tied_params_map``: data pointer -> {device: the tensor already placed there}.
TiedParamsMap = MutableMapping[int, MutableMapping[Any, torch.Tensor]]
_NOT_CAST = ("torch.uint", "torch.int", "torch.bool")
_CPU, _META = torch.device("cpu"), torch.device("meta")


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, storage address, storage bytes)``: equal for tensors sharing one storage.

    Meta tensors have no storage: they all get address 0.

    Example:
        >>> import torch
        >>> base = torch.zeros(4)
        >>> id_tensor_storage(base) == id_tensor_storage(base[2:])
        True
    """
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters, then buffers, of ``module`` with their names, each tensor once.

    Args:
        include_buffers: yield buffers too.
        recurse: the tensors of submodules too (else only ``module``'s own).
        remove_non_persistent: leave out buffers registered with ``persistent=False``.
    """
    seen: set[int] = set()
    for name, tensor in hooks.named_module_tensors(module, include_buffers=include_buffers,
                                                   recurse=recurse,
                                                   remove_non_persistent=remove_non_persistent):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield name, tensor


def _owner(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    *path, leaf = tensor_name.split(".")
    for part in path:
        child = getattr(module, part, None)
        if not isinstance(child, nn.Module):
            raise ValueError(f"{type(module).__name__} has no submodule {part!r} (in "
                             f"{tensor_name!r}); use a name from model.state_dict()")
        module = child
    if leaf not in module._parameters and leaf not in module._buffers:
        raise ValueError(f"{type(module).__name__} has no parameter or buffer named {leaf!r} "
                         f"(in {tensor_name!r}); use a name from model.state_dict()")
    return module, leaf


def _tied(tied_params_map: TiedParamsMap | None, device: Any, *tensors: torch.Tensor | None
          ) -> torch.Tensor | None:
    """The tensor already placed on ``device`` for the storage of one of ``tensors``."""
    for tensor in tensors:
        if tied_params_map is not None and isinstance(tensor, torch.Tensor):
            placed = tied_params_map.get(tensor.data_ptr())
            if placed is not None and device in placed:
                return placed[device]
    return None


def _same_device(first: torch.device, second: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device here (an accelerator without index is 0)."""
    return first.type == second.type and (first.index or 0) == (second.index or 0)


def _cast(value: Any, *, old: torch.Tensor, dtype: torch.dtype | None, tensor_name: str,
          non_blocking: bool) -> torch.Tensor:
    tensor: torch.Tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    if tensor.shape != old.shape:
        raise ValueError(f"value for {tensor_name!r} has shape {tuple(tensor.shape)}, the module's "
                         f"tensor has {tuple(old.shape)}; is this the right checkpoint?")
    if dtype is None:  # as nn.Module.load_state_dict: the module's dtype wins
        return tensor.to(old.dtype, non_blocking=non_blocking)
    if str(tensor.dtype).startswith(_NOT_CAST):
        return tensor
    return tensor.to(dtype, non_blocking=non_blocking)


def _as_parameter(data: torch.Tensor, *, old: nn.Parameter, device: torch.device,
                  non_blocking: bool) -> torch.Tensor:
    """``data`` as a parameter of ``old``'s class on ``device``, ``requires_grad`` kept."""
    cls = type(old)
    hf_initialized = old.__dict__.get("_is_hf_initialized")
    new: torch.Tensor = cls(data, requires_grad=old.requires_grad)
    new = new.to(device, non_blocking=non_blocking)
    if hf_initialized is not None:
        new._is_hf_initialized = hf_initialized  # type: ignore[attr-defined]  # transformers' flag
    return new


def set_module_tensor_to_device(
        module: nn.Module, tensor_name: str, device: int | str | torch.device,
        value: torch.Tensor | None = None, dtype: str | torch.dtype | None = None,
        fp16_statistics: torch.Tensor | None = None,
        tied_params_map: TiedParamsMap | None = None, non_blocking: bool = False,
        clear_cache: bool = True) -> None:
    """Set the parameter or buffer ``tensor_name`` (dotted, from ``module``) on ``device``.

    Args:
        device: where it goes (an int is an accelerator index, as in device maps).
        value: its new value (needed to leave the ``meta`` device); same shape as the tensor.
        dtype: cast a floating ``value`` to this; None: to the current tensor's dtype.
        fp16_statistics: stored as the new parameter's ``SCB`` attribute (bitsandbytes' int8
            statistics, kept for compatibility; accel does not quantise).
        tied_params_map: data pointer -> {device: tensor}. A tensor (or ``value``) whose storage
            is there with ``device`` reuses that tensor (tied weights take memory once); a new
            placement is recorded there for the storages already in the map.
        non_blocking: asynchronous copies where the device allows.
        clear_cache: empty the accelerator's allocator cache afterwards (not for cpu/meta).

    Raises:
        ValueError: no such tensor; a ``meta`` tensor without ``value``; a shape mismatch.
    """
    owner, leaf = _owner(module, tensor_name)
    is_buffer = leaf in owner._buffers
    old = getattr(owner, leaf)
    reused = _tied(tied_params_map, device, value, old)
    if reused is not None:
        if is_buffer:
            owner._buffers[leaf] = reused
        else:
            owner._parameters[leaf] = reused  # type: ignore[assignment]  # tied: a Parameter
        return
    target = as_device(device)
    if old.is_meta and target != _META and value is None:
        raise ValueError(f"{tensor_name!r} is on the meta device (it has no data); pass its "
                         f"value=... to put it on {target}")
    wanted = parse_dtype(dtype) if dtype is not None else None
    with torch.no_grad():
        if value is not None:
            new = _cast(value, old=old, dtype=wanted, tensor_name=tensor_name,
                        non_blocking=non_blocking).to(target, non_blocking=non_blocking)
        else:
            new = old.to(target, non_blocking=non_blocking)
            if wanted is not None and target == _META and not str(old.dtype).startswith(_NOT_CAST):
                new = new.to(wanted)
        if is_buffer:
            owner._buffers[leaf] = new
        else:
            param = owner._parameters[leaf]
            assert param is not None  # _owner found it
            if value is not None or new.dtype != param.dtype or \
                    not _same_device(target, param.device):
                new = _as_parameter(new, old=param, device=target, non_blocking=non_blocking)
                owner._parameters[leaf] = new  # type: ignore[assignment]
                if fp16_statistics is not None:
                    new.SCB = fp16_statistics.to(target)  # type: ignore[attr-defined]
    if clear_cache and target not in (_CPU, _META):
        clear_device_cache()
    _record(tied_params_map, device=device, owner=owner, leaf=leaf, value=value, old=old)


def _record(tied_params_map: TiedParamsMap | None, *, device: Any, owner: nn.Module, leaf: str,
            value: torch.Tensor | None, old: torch.Tensor) -> None:
    if tied_params_map is None:
        return
    for tensor in (old, value):
        if isinstance(tensor, torch.Tensor):
            placed = tied_params_map.get(tensor.data_ptr())
            if placed is not None and device not in placed:
                placed[device] = getattr(owner, leaf)
                return


def _offloading_hook(module: nn.Module) -> AlignDevicesHook | None:
    """``module``'s offloading hook, alone or within a :class:`SequentialHook`."""
    hook = module.__dict__.get("_hf_hook")
    chain = hook.hooks if isinstance(hook, hooks.SequentialHook) else (hook,)
    return next((h for h in chain if isinstance(h, AlignDevicesHook) and h.offload), None)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module`` has an offloading :class:`~accel.big_modeling.AlignDevicesHook`
    (its weights are brought to the execution device for each forward only), alone or
    within a :class:`~accel.big_modeling.SequentialHook`."""
    return _offloading_hook(module) is not None


@contextmanager
def align_module_device(module: nn.Module,
                        execution_device: torch.device | str | int | None = None
                        ) -> Iterator[None]:
    """Inside the block, ``module``'s own parameters are on its execution device.

    An offloaded module (see :func:`has_offloaded_params`) has its weights materialised there (on
    ``execution_device`` when given, else its hook's) and dropped again on exit. Any other module
    has its own parameters moved to ``execution_device`` and back; with no ``execution_device``
    nothing changes.
    """
    hook = _offloading_hook(module)
    if hook is not None:
        original = hook.execution_device
        if execution_device is not None:
            hook.execution_device = as_device(execution_device)
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = original
    elif execution_device is not None:
        devices = {name: p.device for name, p in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield
