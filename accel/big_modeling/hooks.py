"""Forward hooks that place a module's weights and inputs (Accelerate's ``accelerate.hooks``).

:func:`add_hook_to_module` wraps a module's ``forward`` with a :class:`ModelHook`'s
``pre_forward``/``post_forward``; :func:`remove_hook_from_module` calls the hook's
``detach_hook`` and gives the module its own ``forward`` back. :class:`AlignDevicesHook` moves
inputs to an execution device and, with ``offload=True``, keeps the module's weights elsewhere
(a CPU state dict, or an offload folder on disk): they are materialised on the execution device
just before the forward, once per forward, and dropped (back to the ``meta`` device) just after.
The attribute names (``_hf_hook``, ``_old_forward``) are Accelerate's, which transformers reads.

Example:
    >>> import torch
    >>> layer = torch.nn.Linear(2, 2)
    >>> _ = add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", offload=True))
    >>> layer.weight.device.type, layer(torch.ones(1, 2)).shape
    ('meta', torch.Size([1, 2]))
    >>> _ = remove_hook_from_module(layer)
    >>> layer.weight.device.type, "forward" in layer.__dict__
    ('cpu', False)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..data import send_to_device

__all__ = ["AlignDevicesHook", "CpuOffload", "ModelHook", "SequentialHook", "TiedWeights",
           "add_hook_to_module", "as_device", "named_module_tensors", "remove_hook_from_module",
           "place_tensors", "remove_hook_from_submodules", "set_module_tensor", "storage_key",
           "UserCpuOffloadHook"]

_META = torch.device("meta")


class ModelHook:
    """Base hook: every method returns its input unchanged. ``no_grad``: run forward without
    autograd."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called once when the hook is attached."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Called before the module's forward with its inputs; returns the inputs to use."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the module's forward with its output; returns the output to use."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed: undo what ``init_hook`` did."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (``post_forward`` and ``detach_hook`` in order too)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = module.__dict__["_hf_hook"]
    forward = module.__dict__["_old_forward"]
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = forward(*args, **kwargs)
    else:
        output = forward(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attach ``hook`` to ``module`` (replacing its hook, or chained after it with ``append``).

    Returns:
        ``module`` itself (changed in place).
    """
    old = module.__dict__.get("_hf_hook")
    if append and old is not None:
        remove_hook_from_module(module)
        hook = SequentialHook(old, hook)
    state = module.__dict__
    if "_old_forward" not in state:
        state["_accel_own_forward"] = "forward" in state
        state["_old_forward"] = module.forward
    elif old is not None:
        old.detach_hook(module)
    module = hook.init_hook(module)
    state = module.__dict__
    state["_hf_hook"] = hook
    wrapped = functools.partial(_hooked_forward, module)
    state["forward"] = functools.update_wrapper(wrapped, state["_old_forward"])
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook of ``module`` (and of all its submodules with ``recurse``) and give it
    its own ``forward`` back."""
    hook = module.__dict__.pop("_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
    if "_old_forward" in module.__dict__:
        old_forward = module.__dict__.pop("_old_forward")
        if module.__dict__.pop("_accel_own_forward", False):
            module.__dict__["forward"] = old_forward
        else:
            module.__dict__.pop("forward", None)  # the class's forward is visible again
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove the hooks of every submodule of ``module`` (not of ``module`` itself)."""
    for child in module.children():
        remove_hook_from_module(child, recurse=True)


def as_device(device: torch.device | str | int) -> torch.device:
    """``device`` as a ``torch.device`` (an int is an accelerator index, as in device maps)."""
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} names an accelerator, but none is available here "
                         f"({exc}); place that part on 'cpu' or 'disk'") from None


def named_module_tensors(module: nn.Module, *, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Every parameter (and buffer) name of ``module`` with its tensor, tied names included."""
    yield from module.named_parameters(recurse=recurse, remove_duplicate=False)
    if not include_buffers:
        return
    for name, buf in module.named_buffers(recurse=recurse, remove_duplicate=False):
        owner, _, leaf = name.rpartition(".")
        if remove_non_persistent and \
                leaf in module.get_submodule(owner)._non_persistent_buffers_set:
            continue
        yield name, buf


def set_module_tensor(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Put ``value`` under the parameter or buffer ``name`` of ``module`` (no copy, no checks)."""
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = value  # type: ignore[assignment]
    elif leaf in owner._buffers:
        owner._buffers[leaf] = value
    else:
        raise KeyError(f"{name!r} is neither a parameter nor a buffer of "
                       f"{type(module).__name__}")


@dataclass(kw_only=True, slots=True)
class TiedWeights:
    """What the hooks of one dispatch share (Accelerate's ``tied_params_map``, reshaped).

    ``shared``: canonical names read by several offloaded names (tied weights). Those stay
    materialised in ``live`` from their first use until the owner calls :meth:`clear` (at the
    end of the model's forward), so a tied weight is copied once per forward, not once per user.
    ``twins``: the meta tensor left for each offloaded original (by ``id``) and ``placed``: the
    tensor placed on a device for each original, so that ties stay one object.
    """

    shared: set[str] = field(default_factory=set)
    live: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    twins: dict[int, torch.Tensor] = field(default_factory=dict)
    placed: dict[int, torch.Tensor] = field(default_factory=dict)
    restored: dict[int, torch.Tensor] = field(default_factory=dict)  # by id of the meta twin

    def clear(self) -> None:
        self.live.clear()


def storage_key(tensor: torch.Tensor) -> str:
    """The same string for views of the same memory (tied weights), else different."""
    if tensor.is_meta or not tensor.numel():
        return f"id:{id(tensor)}"
    return (f"mem:{tensor.device}:{tensor.untyped_storage().data_ptr()}:"
            f"{tensor.storage_offset()}:{tuple(tensor.shape)}:{tensor.stride()}")


def _twin(tensor: torch.Tensor, *, device: torch.device, requires_grad: bool | None = None
          ) -> torch.Tensor:
    """``tensor`` on ``device`` (no copy when already there), a Parameter if it was one."""
    data = tensor.detach().to(device)
    if isinstance(tensor, nn.Parameter) or requires_grad is not None:
        grad = tensor.requires_grad if requires_grad is None else requires_grad
        return nn.Parameter(data, requires_grad=grad)
    return data


def place_tensors(module: nn.Module, device: torch.device, recurse: bool,
                  memo: MutableMapping[int, torch.Tensor], include_buffers: bool = True) -> None:
    """Move ``module``'s tensors to ``device``; tensors met before (tied) reuse ``memo``."""
    for name, tensor in list(named_module_tensors(module, include_buffers=include_buffers,
                                                  recurse=recurse)):
        placed = memo.get(id(tensor))
        if placed is None:
            if tensor.is_meta and device != _META:
                raise ValueError(f"{name!r} is on the meta device (it has no data) and cannot be "
                                 f"placed on {device}; load its weights first "
                                 "(load_checkpoint_in_model) or map its module to 'disk'")
            placed = tensor if tensor.device == device else _twin(tensor, device=device)
            memo[id(tensor)] = placed
        set_module_tensor(module, name, placed)


def _find_device(data: Any) -> torch.device | None:
    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data
    if isinstance(values, (list, tuple)) or isinstance(data, Mapping):
        for item in values:
            found = _find_device(item)
            if found is not None:
                return found
    return None


def _refuse_meta_inputs(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                       ) -> None:
    """A meta input has no data: something upstream ran on weights that were never loaded."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.is_meta:
            raise RuntimeError(
                f"{type(module).__name__} got an input on the meta device: a module before it "
                "used offloaded weights of a submodule it did not call; pass that module's class "
                "in preload_module_classes=[...] so its weights load for its whole forward")


class AlignDevicesHook(ModelHook):
    """Inputs (and weights) on ``execution_device`` for the forward; weights offloaded with
    ``offload=True``.

    Args:
        execution_device: where the forward runs (None: where the inputs are).
        offload: keep the weights in ``weights_map`` (default: a CPU copy of the module's
            tensors, made once) and materialise them for each forward only.
        io_same_device: give the output back on the device the first input tensor was on.
        weights_map: name -> tensor mapping (e.g. an ``OffloadedWeightsLoader`` over an offload
            folder, or a :class:`~accel.big_modeling.offload.PrefixedDataset` of one).
        offload_buffers: offload buffers too (by default they live on the execution device).
        place_submodules: handle the tensors of submodules too (not only the module's own).
        skip_keys: keys of dict inputs that are not moved.
        tied_params_map: a :class:`TiedWeights` shared by the hooks of one model.
    """

    def __init__(self, execution_device: torch.device | str | int | None = None,
                 offload: bool = False, io_same_device: bool = False,
                 weights_map: Mapping[str, torch.Tensor] | None = None,
                 offload_buffers: bool = False, place_submodules: bool = False,
                 skip_keys: str | list[str] | None = None,
                 tied_params_map: TiedWeights | None = None) -> None:
        self.execution_device = None if execution_device is None else as_device(execution_device)
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map if tied_params_map is not None else TiedWeights()
        self.input_device: torch.device | None = None
        self._meta: dict[str, torch.Tensor] = {}  # offloaded name -> its meta twin
        self._originals: dict[str, torch.Tensor] = {}  # kept when weights_map shares them
        self._devices: dict[str, torch.device] = {}

    def __repr__(self) -> str:
        return (f"AlignDevicesHook(execution_device={self.execution_device}, "
                f"offload={self.offload}, io_same_device={self.io_same_device}, "
                f"offload_buffers={self.offload_buffers}, "
                f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})")

    def _offloaded(self, module: nn.Module) -> list[tuple[str, torch.Tensor]]:
        return list(named_module_tensors(module, include_buffers=self.offload_buffers,
                                         recurse=self.place_submodules,
                                         remove_non_persistent=True))

    def init_hook(self, module: nn.Module) -> nn.Module:
        if not self.offload:
            if self.execution_device is not None:
                place_tensors(module, self.execution_device, self.place_submodules,
                              self.tied_params_map.placed)
            return module
        memo = self.tied_params_map.twins
        tensors = self._offloaded(module)
        if self.weights_map is None:  # keep the CPU data (no copy when it is on the CPU)
            self.weights_map = {name: t.detach().to("cpu") for name, t in tensors}
            self._originals = dict(tensors)
        placed = self.tied_params_map.placed
        for name, tensor in tensors:
            if id(tensor) in placed and placed[id(tensor)].device == self.execution_device:
                set_module_tensor(module, name, placed[id(tensor)])  # tied to a placed weight
                continue
            self._devices[name] = tensor.device
            twin = memo.get(id(tensor))
            if twin is None:
                twin = _twin(tensor, device=torch.device("meta"))
                memo[id(tensor)] = twin
            self._meta[name] = twin
            set_module_tensor(module, name, twin)
        if self.execution_device is not None:  # buffers not offloaded live there
            offloaded = {name for name, _ in tensors}
            for name, buf in list(module.named_buffers(recurse=self.place_submodules,
                                                       remove_duplicate=False)):
                if name not in offloaded:
                    set_module_tensor(module, name, buf.to(self.execution_device))
        return module

    def _canonical(self, name: str) -> str:
        method = getattr(self.weights_map, "canonical", None)
        if callable(method):
            return str(method(name))
        assert self.weights_map is not None  # set in init_hook
        return storage_key(self.weights_map[name])  # an in-memory map: cheap to look at

    def _materialise(self, name: str, local: dict[str, torch.Tensor]) -> torch.Tensor:
        assert self.weights_map is not None  # set in init_hook
        key = self._canonical(name)
        tied = self.tied_params_map
        shared_key = (key, str(self.execution_device))
        value = local.get(key)
        if value is None and key in tied.shared:
            value = tied.live.get(shared_key)
        if value is None:
            stored = self.weights_map[name]
            device = self.execution_device or stored.device
            meta = self._meta[name]
            value = _twin(stored, device=device, requires_grad=meta.requires_grad
                          if isinstance(meta, nn.Parameter) else None)
            if key in tied.shared:
                tied.live[shared_key] = value
        local[key] = value
        return value

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.io_same_device:
            self.input_device = _find_device([args, kwargs])
        if self.offload:
            local: dict[str, torch.Tensor] = {}
            for name in self._meta:
                set_module_tensor(module, name, self._materialise(name, local))
        device = self.execution_device
        if device is not None and device != _META:
            _refuse_meta_inputs(module, args, kwargs)
        return (send_to_device(args, device),
                send_to_device(kwargs, device, skip_keys=self.skip_keys))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name, twin in self._meta.items():
                set_module_tensor(module, name, twin)
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if not self.offload or self.weights_map is None:
            return module
        restored = self.tied_params_map.restored
        for name, twin in self._meta.items():
            device = self._devices[name]
            if name in self._originals:
                value = self._originals[name]
            elif device == _META:
                value = twin
            elif id(twin) in restored:
                value = restored[id(twin)]
            else:  # a copy in ordinary memory: the folder may go away after this
                stored = self.weights_map[name]
                data = torch.empty(stored.shape, dtype=stored.dtype, device=device)
                data.copy_(stored)
                value = nn.Parameter(data, twin.requires_grad) \
                    if isinstance(twin, nn.Parameter) else data
            restored[id(twin)] = value
            set_module_tensor(module, name, value)
        self._meta.clear()
        self._originals.clear()
        return module


class CpuOffload(ModelHook):
    """The whole module on ``execution_device`` from its forward on, until ``offload()`` puts it
    back on the CPU (the previous model's hook does that when the next model runs)."""

    def __init__(self, execution_device: torch.device | str | int | None = None,
                 prev_module_hook: UserCpuOffloadHook | None = None) -> None:
        self.execution_device = as_device(execution_device if execution_device is not None
                                          else "cpu")
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        module.to(self.execution_device)
        return (send_to_device(args, self.execution_device),
                send_to_device(kwargs, self.execution_device))


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` the model now, or ``remove()`` the
    hook."""

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model, self.hook = model, hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)
