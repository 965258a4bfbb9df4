"""Cutting per-batch outputs down to the batch's real samples (before a metrics gather).

Example:
    >>> import torch
    >>> out = trim_batch({"pred": torch.arange(4), "loss": torch.tensor(1.0)}, size=4, real=3)
    >>> out["pred"].tolist(), out["loss"].item()
    ([0, 1, 2], 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._base.tree import is_namedtuple

__all__ = ["trim_batch"]

_SCALARS = (str, bytes, int, float, bool, complex, type(None))


def trim_batch(data: Any, size: int, real: int) -> Any:
    """Return ``data`` with every per-sample leaf cut to its first ``real`` entries.

    A per-sample leaf is a tensor with at least one dimension whose first dimension is
    ``size``, or a list of ``size`` plain values (strings, numbers). Other leaves (a scalar
    loss, a tensor of another length) are kept whole. Nothing changes when ``real >= size``.
    """
    if real >= size:
        return data
    return _trim(data, size, real)


def _trim(data: Any, size: int, real: int) -> Any:
    if isinstance(data, torch.Tensor):
        return data[:real] if data.dim() >= 1 and data.shape[0] == size else data
    if is_namedtuple(data):
        return type(data)(*(_trim(item, size, real) for item in data))
    if isinstance(data, list) and len(data) == size and all(
            isinstance(item, _SCALARS) for item in data):
        return data[:real]
    if isinstance(data, (list, tuple)):
        return type(data)(_trim(item, size, real) for item in data)
    if isinstance(data, Mapping):
        items = {key: _trim(value, size, real) for key, value in data.items()}
        try:
            # Mapping declares no constructor arguments; a type that takes none fails below.
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    return data
