"""Full precision (``mixed_precision="no"``): no autocast, no scaling."""

from __future__ import annotations

from .base import Precision

__all__ = ["NoPrecision"]


class NoPrecision(Precision):
    """Full precision: every method of :class:`Precision` as it is."""
