"""What the autocast modes share: the autocast context and the forward wrapper around it."""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._base import tree as _tree
from ..config.settings import AutocastKwargs
from .base import Precision

__all__ = ["AutocastForward", "AutocastPrecision"]


def _to_fp32(data: Any) -> Any:
    # Outputs leave the autocast region in float32 so that losses computed outside it (and
    # metrics gathered from it) do not silently run in half precision.
    return _tree.apply(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t,
                       data=data)


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
        kw = self.autocast_kwargs
        model.forward = AutocastForward(model.forward, self.device.type, self.dtype, kw.enabled,
                                        kw.cache_enabled)
        return model


class AutocastForward:
    """A module's forward run under ``torch.autocast``, outputs handed back in float32.

    A class rather than a closure so that a prepared model can be pickled (DataLoader workers
    started with ``spawn``) and deep-copied (an EMA copy then calls its own forward, not the
    original's): a bound forward is kept as its function and its module, and rebound on call.
    ``inspect.signature`` sees the original's signature (``__wrapped__``).

    Example:
        >>> lin = torch.nn.Linear(2, 2)
        >>> lin.forward = AutocastForward(lin.forward, "cpu", torch.bfloat16, True, None)
        >>> lin(torch.ones(1, 2)).dtype  # computed in bfloat16, returned in float32
        torch.float32
    """

    def __init__(self, original: Callable[..., Any], device_type: str, dtype: torch.dtype,
                 enabled: bool, cache_enabled: bool | None) -> None:
        self._func: Callable[..., Any] = getattr(original, "__func__", original)
        self._module: Any = getattr(original, "__self__", None)
        self._device_type, self._dtype = device_type, dtype
        self._kwargs: dict[str, Any] = {"enabled": enabled}
        if cache_enabled is not None:
            self._kwargs["cache_enabled"] = cache_enabled
        functools.update_wrapper(self, original)

    @property
    def _accel_original(self) -> Callable[..., Any]:
        """The forward this one wraps (``remove_forward_wrapper`` puts it back)."""
        if self._module is None:
            return self._func
        return types.MethodType(self._func, self._module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self._device_type, dtype=self._dtype, **self._kwargs):
            if self._module is None:
                return _to_fp32(self._func(*args, **kwargs))
            return _to_fp32(self._func(self._module, *args, **kwargs))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("__wrapped__", None)  # a bound method of the module: rebuilt on load
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__wrapped__ = self._accel_original
