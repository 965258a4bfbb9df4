"""One process on one device."""

from __future__ import annotations

from .base import Strategy

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    name = "single"
