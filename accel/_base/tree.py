"""Walk nested dict/list/tuple (and namedtuple, dataclass-like Mappings) structures of tensors.

Example:
    >>> import torch
    >>> leaves, rebuild = flatten({"a": torch.ones(2), "b": (torch.zeros(1), 3)}, strict=False)
    >>> len(leaves)
    2
    >>> rebuild([x * 2 for x in leaves])["a"].tolist()
    [2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["apply", "flatten", "is_namedtuple"]


def is_namedtuple(data: Any) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_fields")


def _rebuild_mapping(data: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    # Mapping itself declares no constructor arguments; most concrete types take a dict.
    factory: Callable[[dict[Any, Any]], Any] = type(data)
    try:
        return factory(items)
    except TypeError:  # a Mapping type that cannot be built from a dict: hand back a dict
        return items


def apply(fn: Callable[[torch.Tensor], Any], *, data: Any, strict: bool = False,
          other: Callable[[Any], Any] | None = None) -> Any:
    """Return ``data`` with ``fn`` applied to every tensor leaf (structure and types kept).

    Non-tensor leaves are returned unchanged (or passed through ``other``), or rejected with
    ``TypeError`` when ``strict``.
    """
    if isinstance(data, torch.Tensor):
        return fn(data)
    if is_namedtuple(data):
        return type(data)(*(apply(fn, data=item, strict=strict, other=other) for item in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply(fn, data=item, strict=strict, other=other) for item in data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: apply(fn, data=v, strict=strict, other=other)
                                       for k, v in data.items()})
    if other is not None and not strict:
        return other(data)
    if strict:
        raise TypeError(
            f"expected tensors or nested dict/list/tuple of tensors, found {type(data).__name__}; "
            "convert it to a tensor (or use gather_object for arbitrary Python objects)"
        )
    return data


def flatten(
    data: Any, *, strict: bool = True
) -> tuple[list[torch.Tensor], Callable[[list[Any]], Any]]:
    """Collect tensor leaves in a fixed order and return a function that rebuilds the structure."""
    # The common cases (a tensor; a plain tuple or list of tensors) without walking a tree:
    # collectives call this once per call, and the walk costs microseconds.
    if isinstance(data, torch.Tensor):
        return [data], _first
    kind = type(data)
    if (kind is tuple or kind is list) and all(isinstance(x, torch.Tensor) for x in data):
        return list(data), kind
    if kind is dict and all(isinstance(x, torch.Tensor) for x in data.values()):
        keys = list(data)
        return list(data.values()), lambda values: dict(zip(keys, values, strict=True))
    leaves: list[torch.Tensor] = []

    def collect(tensor: torch.Tensor) -> _Slot:
        leaves.append(tensor)
        return _Slot(len(leaves) - 1)

    skeleton = apply(collect, data=data, strict=strict)

    def rebuild(values: list[Any]) -> Any:
        return apply_indices(skeleton, values)

    return leaves, rebuild


def _first(values: list[Any]) -> Any:
    return values[0]


class _Slot:
    """Marks where a tensor leaf was (a plain int could be a real leaf of the structure)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def apply_indices(skeleton: Any, values: list[Any]) -> Any:
    if isinstance(skeleton, _Slot):
        return values[skeleton.index]
    if is_namedtuple(skeleton):
        return type(skeleton)(*(apply_indices(item, values) for item in skeleton))
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(apply_indices(item, values) for item in skeleton)
    if isinstance(skeleton, Mapping):
        items = {k: apply_indices(v, values) for k, v in skeleton.items()}
        return _rebuild_mapping(skeleton, items)
    return skeleton
