"""Moving nested batches to a device, like ``accelerate.utils.send_to_device``.

Example:
    >>> import torch
    >>> batch = {"x": torch.ones(2), "ids": [torch.zeros(1)], "name": "a"}
    >>> moved = send_to_device(batch, torch.device("cpu"))
    >>> moved["name"], moved["x"].device.type
    ('a', 'cpu')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .._base.tree import is_namedtuple

__all__ = ["send_to_device"]


def send_to_device(data: Any, device: torch.device | str | int | None, non_blocking: bool = False,
                   skip_keys: str | Iterable[str] | None = None) -> Any:
    """Return ``data`` with every tensor (and object with a ``.to`` method) on ``device``.

    Lists, tuples, namedtuples and mappings are rebuilt with their own types; values under
    ``skip_keys`` in mappings are left as they are; other objects are returned unchanged.
    ``device=None`` returns ``data`` unchanged.

    Example:
        >>> import torch
        >>> send_to_device((torch.ones(1), 3), "cpu")[1]
        3
    """
    if device is None:
        return data
    skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys or ())
    return _move(data, device=device, non_blocking=non_blocking, skip=skip)


def _move(data: Any, *, device: Any, non_blocking: bool, skip: set[str]) -> Any:
    # Plain tensors already on ``device`` and plain lists and tuples first, without a call
    # into torch: a prepared loader moves every batch (a CPU batch usually goes nowhere).
    kind = type(data)
    if kind is torch.Tensor and data.device == device:
        return data
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if kind is list:
        return [_move(item, device=device, non_blocking=non_blocking, skip=skip) for item in data]
    if kind is tuple:
        return tuple([_move(item, device=device, non_blocking=non_blocking,
                            skip=skip) for item in data])
    if is_namedtuple(data):
        return type(data)(*(_move(item, device=device, non_blocking=non_blocking,
                                  skip=skip) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_move(item, device=device, non_blocking=non_blocking,
                                skip=skip) for item in data)
    if isinstance(data, Mapping):
        items = {key: value if key in skip else _move(value, device=device,
                                                      non_blocking=non_blocking, skip=skip)
                 for key, value in data.items()}
        try:
            # Mapping declares no constructor arguments; a type that takes none fails below.
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:  # a Mapping that cannot be built from a dict: hand back a dict
            return items
    if hasattr(data, "to") and not isinstance(data, (str, bytes, torch.nn.Module)):
        try:
            return data.to(device, non_blocking=non_blocking)
        except TypeError:  # a .to() without the non_blocking keyword
            return data.to(device)
    return data
