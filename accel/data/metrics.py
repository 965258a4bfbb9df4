"""``gather_for_metrics``: every evaluation sample exactly once, in order, on every rank.

The active prepared loader knows how many samples of the current batch are real (the rest pad
an uneven last batch) and which ranks still take part in an uneven last step; outputs are cut
to the real samples and gathered over those ranks only.
"""

from __future__ import annotations

from typing import Any

from .._base import tree as _tree
from ..distributed import Communicator
from .loader import DataTracker

__all__ = ["gather_for_metrics"]


def gather_for_metrics(comm: Communicator, *, tracker: DataTracker, data: Any,
                       use_gather_object: bool = False) -> Any:
    """Gather ``data`` computed on the active loader's current batch, without padded samples.

    Tensors (and nested structures of tensors) go through one flattened collective; anything
    else, or ``use_gather_object=True``, through ``gather_object``.
    """
    loader = tracker.active
    if loader is not None:
        data = loader.trim_for_metrics(data)
    group = loader.metrics_group if loader is not None else None
    try:
        leaves, rebuild = _tree.flatten(data, strict=True)
    except TypeError:  # a leaf that is not a tensor
        leaves = []
    if use_gather_object or not leaves:
        return comm.gather_object(data, group=group)
    return comm.gather_flat(leaves, rebuild, group=group)
