"""Big models: build a model without allocating its weights (Accelerate's ``big_modeling``).

``init_empty_weights()`` constructs modules with their parameters on the ``meta`` device: shapes
and dtypes only, no storage, so a model far larger than this machine's memory is built in
moments. Such a model is a skeleton to be filled later, e.g. by
``FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)``, where rank 0 holds the real
weights and every other rank builds its model under ``init_empty_weights()`` and receives only
its own shards.

Example:
    >>> import torch
    >>> with init_empty_weights():
    ...     model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.BatchNorm1d(4096))
    >>> model[0].weight.device, model[1].running_mean.device
    (device(type='meta'), device(type='cpu'))
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from .. import env

__all__ = ["init_empty_weights", "init_on_device"]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Construct modules with their parameters on the ``meta`` device (no memory allocated).

    Any model created under this context manager has no weights: fill it with
    ``model.to_empty(device=...)`` and a state dict, or hand it to an FSDP ``Accelerator``
    with ``cpu_ram_efficient_loading=True`` on every rank but rank 0.

    Args:
        include_buffers: put buffers on the ``meta`` device too (then every tensor created
            inside goes there). None (the default): the ``ACCEL_INIT_INCLUDE_BUFFERS`` setting,
            off when unset. Buffers are often computed at construction (position ids, rotary
            frequencies) and cannot be recovered from a meta tensor; leave them real unless
            they are in the checkpoint you load.

    Example:
        >>> import torch
        >>> with init_empty_weights(include_buffers=True):
        ...     norm = torch.nn.BatchNorm1d(8)
        >>> norm.weight.is_meta, norm.running_var.is_meta
        (True, True)
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: torch.device | str,
                   include_buffers: bool | None = None) -> Iterator[None]:
    """Construct modules with their parameters on ``device``.

    Args:
        device: where parameters are created, e.g. ``"meta"`` or ``torch.device("cuda", 0)``.
        include_buffers: also create buffers (and every other tensor made without an explicit
            device) on ``device``. None: the ``ACCEL_INIT_INCLUDE_BUFFERS`` setting (off).

    A parameter assigned twice (tied weights, ``head.weight = embed.weight``) stays one object.
    The switch is process-wide while the block runs (as ``nn.Module`` is patched): do not
    construct modules in other threads meanwhile.

    Example:
        >>> import torch
        >>> with init_on_device("meta"):
        ...     layer = torch.nn.Linear(3, 2)
        >>> layer.weight.shape, layer.weight.device
        (torch.Size([2, 3]), device(type='meta'))
    """
    target = torch.device(device)
    if include_buffers is None:
        include_buffers = env.read_settings().init_include_buffers
    if include_buffers:
        with target:  # every factory call without an explicit device lands on `target`
            yield
        return
    original = nn.Module.register_parameter
    setattr(nn.Module, "register_parameter", _moving_register(original, target))  # noqa: B010
    try:
        yield
    finally:
        setattr(nn.Module, "register_parameter", original)  # noqa: B010


def _moving_register(current: Callable[..., None], target: torch.device
                     ) -> Callable[[nn.Module, str, nn.Parameter | None], None]:
    """``nn.Module.register_parameter`` that re-creates each new parameter on ``target``.

    Nested blocks: the innermost wins, so each wrapper calls torch's own method (kept on the
    wrapper), not the enclosing block's wrapper.
    """
    base: Callable[..., None] = getattr(current, "_accel_torch_method", current)

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        base(module, name, param)
        if param is None or _on(param, target):
            return  # already there (a tied parameter registered again keeps its identity)
        module._parameters[name] = _moved(param, target)

    register._accel_torch_method = base  # type: ignore[attr-defined]
    return register


def _on(tensor: torch.Tensor, target: torch.device) -> bool:
    here = tensor.device
    return here.type == target.type and (target.index is None or here.index == target.index)


def _moved(param: nn.Parameter, target: torch.device) -> nn.Parameter:
    """``param`` re-created on ``target``: same class, ``requires_grad`` and attributes."""
    with torch.no_grad():
        data = param.data.to(target)
    attributes: dict[str, Any] = dict(param.__dict__)
    moved = type(param)(data, requires_grad=param.requires_grad)
    moved.__dict__.update(attributes)
    return moved
