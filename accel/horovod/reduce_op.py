"""Horovod's reduction operations: ``hvd.Average``, ``hvd.Sum``, ``hvd.Min``, ...

The values are Horovod's own integers, so code that stores or compares them keeps working.

Example:
    >>> from accel.horovod import reduce_op
    >>> reduce_op.Average, reduce_op.Sum, reduce_op.name_of(reduce_op.Max)
    (0, 1, 'Max')
"""

from __future__ import annotations

__all__ = ["Adasum", "Average", "Max", "Min", "Product", "Sum", "name_of"]

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
          Product: "Product"}


def name_of(op: int) -> str:
    """The name of a reduction; ``ValueError`` listing the valid ones for anything else."""
    try:
        return _NAMES[op]
    except (KeyError, TypeError):
        raise ValueError(f"op={op!r} is not a Horovod reduction; use one of hvd.Average, "
                         "hvd.Sum, hvd.Min, hvd.Max, hvd.Product") from None
