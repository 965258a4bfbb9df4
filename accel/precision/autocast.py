"""What the autocast modes share: the autocast context and the forward wrapper around it."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import nn

from .. import _tree
from ..config import AutocastKwargs
from .base import _ORIGINAL, Precision

__all__ = ["AutocastPrecision"]


def _to_fp32(data: Any) -> Any:
    # Outputs leave the autocast region in float32 so that losses computed outside it (and
    # metrics gathered from it) do not silently run in half precision.
    return _tree.apply(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t,
                       data)


class AutocastPrecision(Precision):
    """Runs forward passes under ``torch.autocast`` with ``dtype``."""

    dtype: torch.dtype = torch.float32

    def forward_context(self, autocast: AutocastKwargs | None = None
                        ) -> contextlib.AbstractContextManager[Any]:
        kw = autocast or self.autocast_kwargs
        extra = {} if kw.cache_enabled is None else {"cache_enabled": kw.cache_enabled}
        return torch.autocast(device_type=self.device.type, dtype=self.dtype,
                              enabled=kw.enabled, **extra)

    def wrap_forward(self, model: nn.Module) -> nn.Module:
        original = model.forward
        context = self.forward_context

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with context():
                return _to_fp32(original(*args, **kwargs))

        setattr(forward, _ORIGINAL, original)
        model.forward = forward
        return model
