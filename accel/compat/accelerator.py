"""The public ``Accelerator``: the engine's facade under Accelerate's module path."""

from __future__ import annotations

from ..accelerator.facade import Accelerator

__all__ = ["Accelerator"]
