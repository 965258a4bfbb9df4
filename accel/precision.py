"""Mixed precision: one class per mode (``no``, ``fp16`` with a GradScaler, ``bf16``).

Each exposes ``forward_context()``, ``backward(loss)``, ``unscale_(optimizer)`` (at most once
per real optimizer step), ``optimizer_step(optimizer) -> bool`` (False when the fp16 scaler
skipped the step) and a state dict.

Example:
    >>> import torch
    >>> p = make_precision("bf16", torch.device("cpu"))
    >>> with p.forward_context():
    ...     y = torch.nn.Linear(2, 2)(torch.ones(1, 2))
    >>> y.dtype
    torch.bfloat16
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from .config import AutocastKwargs, GradScalerKwargs, PrecisionType, parse_mixed_precision

__all__ = ["BF16Precision", "FP16Precision", "NoPrecision", "Precision", "make_precision",
           "check_trainable_dtypes"]


class Precision:
    """Full precision: no autocast, no scaling."""

    mode = PrecisionType.NO

    def __init__(self, device: torch.device, autocast: AutocastKwargs | None = None) -> None:
        self.device = device
        self.autocast_kwargs = autocast or AutocastKwargs()
        self._unscaled: set[int] = set()

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return None

    def forward_context(self, autocast: AutocastKwargs | None = None
                        ) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.scale_loss(loss).backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale gradients of ``optimizer`` once per real step (no-op without a scaler)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        optimizer.step(**kwargs)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


NoPrecision = Precision


class _Autocast(Precision):
    dtype: torch.dtype = torch.float32

    def forward_context(self, autocast: AutocastKwargs | None = None
                        ) -> contextlib.AbstractContextManager[Any]:
        kw = autocast or self.autocast_kwargs
        extra = {} if kw.cache_enabled is None else {"cache_enabled": kw.cache_enabled}
        return torch.autocast(device_type=self.device.type, dtype=self.dtype,
                              enabled=kw.enabled, **extra)


class BF16Precision(_Autocast):
    """bfloat16 autocast (CPU, CUDA with bf16 support, XLA). No loss scaling needed."""

    mode = PrecisionType.BF16
    dtype = torch.bfloat16


class FP16Precision(_Autocast):
    """float16 autocast with ``torch.amp.GradScaler``."""

    mode = PrecisionType.FP16
    dtype = torch.float16

    def __init__(self, device: torch.device, autocast: AutocastKwargs | None = None,
                 scaler_kwargs: GradScalerKwargs | None = None) -> None:
        super().__init__(device, autocast)
        kw = (scaler_kwargs or GradScalerKwargs()).to_kwargs()
        self._scaler = torch.amp.GradScaler(device.type, **kw)

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self._scaler

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._unscaled:
            return
        self._scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        before = self._scaler.get_scale()
        self._scaler.step(optimizer, **kwargs)
        self._scaler.update()
        self._unscaled.discard(id(optimizer))
        # GradScaler lowers the scale exactly when it found inf/nan and skipped the step.
        return not self._scaler.get_scale() < before

    def state_dict(self) -> dict[str, Any]:
        return dict(self._scaler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self._scaler.load_state_dict(state)


def make_precision(
    mode: str | PrecisionType | None,
    device: torch.device,
    autocast: AutocastKwargs | None = None,
    scaler_kwargs: GradScalerKwargs | None = None,
    bf16_supported: bool = True,
) -> Precision:
    """Build the precision policy for ``mode`` on ``device``.

    Raises:
        ValueError: unknown mode, or bf16 requested where the device lacks it (with the fix).
    """
    kind = parse_mixed_precision(mode)
    if kind is PrecisionType.BF16:
        if not bf16_supported:
            raise ValueError(
                f"mixed_precision='bf16' was requested but {device} does not support bfloat16 "
                "(needs an Ampere-or-newer GPU); use mixed_precision='fp16' or 'no'"
            )
        return BF16Precision(device, autocast)
    if kind is PrecisionType.FP16:
        if device.type == "mps":
            raise ValueError("mixed_precision='fp16' with a GradScaler is not supported on MPS; "
                             "use 'no' or 'bf16'")
        return FP16Precision(device, autocast, scaler_kwargs)
    if scaler_kwargs is not None:
        raise ValueError("GradScalerKwargs was given but mixed_precision is not 'fp16'; "
                         "remove the handler or set mixed_precision='fp16'")
    return Precision(device, autocast)


def check_trainable_dtypes(mode: PrecisionType, named_params: Iterable[tuple[str, Any]]) -> None:
    """fp16 AMP needs fp32 master weights: refuse fp16 trainable parameters, naming them."""
    if mode is not PrecisionType.FP16:
        return
    bad = [name for name, p in named_params if p.requires_grad and p.dtype == torch.float16]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(
            f"mixed_precision='fp16' needs float32 trainable parameters, but {shown} are "
            "float16 (the GradScaler cannot unscale fp16 gradients). Keep the model in float32 "
            "(model.float()) and let autocast use fp16, or use mixed_precision='bf16'"
        )
