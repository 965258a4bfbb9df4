"""Full precision (``mixed_precision="no"``): no autocast, no scaling."""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn

from ..config.settings import AutocastKwargs
from .base import Precision

__all__ = ["NoPrecision"]


class NoPrecision(Precision):
    """Full precision: forward passes run as they are; nothing is installed on the model."""

    def forward_context(self, autocast: AutocastKwargs | None = None
                        ) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def wrap_forward(self, model: nn.Module) -> nn.Module:
        return model
