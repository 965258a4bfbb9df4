"""Debug mode (``ACCEL_DEBUG=1``): ranks compare op, shapes and dtypes before each collective.

Mismatched collectives are the usual cause of hangs or garbage results; in debug mode they raise
``CollectiveMismatchError`` naming what each rank passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist

from .ops import CollectiveMismatchError

__all__ = ["consistency_check"]

# Ops whose first dimension may legitimately differ across ranks.
_UNEVEN_FIRST_DIM = ("gather", "pad_across_processes")


def _signature(op: str, leaves: Sequence[torch.Tensor]) -> tuple[object, ...]:
    uneven = op in _UNEVEN_FIRST_DIM
    return (op, tuple((str(t.dtype), t.dim(), tuple(t.shape[1:] if uneven else t.shape))
                      for t in leaves))


def _describe(op: str, leaves: Sequence[torch.Tensor]) -> str:
    shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in leaves)
    return f"{op}({shapes})"


@contextlib.contextmanager
def consistency_check(op: str, leaves: Sequence[torch.Tensor]) -> Iterator[None]:
    """Hook for ``Communicator``: one all_gather_object of every rank's call, then compare."""
    mine = (_signature(op, leaves), _describe(op, leaves))
    # None only reserves the slots: all_gather_object fills every one of them.
    slots = [None] * dist.get_world_size()
    everyone: list[tuple[tuple[object, ...], str]] = slots  # type: ignore[assignment]
    dist.all_gather_object(everyone, mine)
    if any(sig != everyone[0][0] for sig, _ in everyone):
        lines = "\n".join(f"  rank {rank}: {desc}" for rank, (_, desc) in enumerate(everyone))
        raise CollectiveMismatchError(
            "ranks called collectives that do not match (ACCEL_DEBUG check):\n" + lines +
            "\nMake every rank call the same collective with tensors of the same dtype and "
            "shape (gather may differ in the first dimension only)."
        )
    yield
