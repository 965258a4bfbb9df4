"""Mixed precision: one class per mode (``no``, ``fp16`` with a GradScaler, ``bf16``).

Each exposes ``forward_context()``, ``wrap_forward(model)`` / ``unwrap_forward(model)``,
``backward(loss)``, ``unscale_(optimizer)`` (at most once per real optimizer step),
``optimizer_step(optimizer) -> bool`` (False when the fp16 scaler skipped the step) and a state
dict. ``make_precision`` is the only place that chooses between them.

Example:
    >>> import torch
    >>> p = make_precision("bf16", device=torch.device("cpu"))
    >>> with p.forward_context():
    ...     y = torch.nn.Linear(2, 2)(torch.ones(1, 2))
    >>> y.dtype
    torch.bfloat16
"""

from __future__ import annotations

import torch

from ..config.settings import AutocastKwargs, GradScalerKwargs, PrecisionType, parse_mixed_precision
from ..device import Device
from .base import Precision, remove_forward_wrapper
from .bf16 import BF16Precision
from .fp16 import FP16Precision
from .full import NoPrecision

__all__ = ["BF16Precision", "FP16Precision", "NoPrecision", "Precision", "make_precision",
           "remove_forward_wrapper"]


def make_precision(
    mode: str | PrecisionType | None,
    *,
    device: torch.device,
    autocast: AutocastKwargs | None = None,
    scaler_kwargs: GradScalerKwargs | None = None,
    hardware: Device | None = None,
) -> Precision:
    """Build the precision policy for ``mode`` on ``device``.

    Args:
        mode: ``"no"``, ``"fp16"`` or ``"bf16"`` (or a ``PrecisionType``).
        device: the torch device forward passes run on.
        autocast: default ``AutocastKwargs`` for the forward context.
        scaler_kwargs: ``GradScalerKwargs`` (fp16 only).
        hardware: the device kind, asked whether it supports the mode (None: assume it does).

    Raises:
        ValueError: unknown mode, or a mode the device lacks (with the fix).
    """
    kind = parse_mixed_precision(mode)
    if kind is PrecisionType.BF16:
        if hardware is not None and not hardware.supports_bf16():
            raise ValueError(
                f"mixed_precision='bf16' was requested but {device} does not support bfloat16 "
                "(needs an Ampere-or-newer GPU); use mixed_precision='fp16' or 'no'"
            )
        return BF16Precision(device, autocast)
    if kind is PrecisionType.FP16:
        if hardware is not None and not hardware.supports_fp16_scaler():
            raise ValueError(f"mixed_precision='fp16' with a GradScaler is not supported on "
                             f"{device.type}; use 'no' or 'bf16'")
        return FP16Precision(device, autocast, scaler_kwargs)
    if scaler_kwargs is not None:
        raise ValueError("GradScalerKwargs was given but mixed_precision is not 'fp16'; "
                         "remove the handler or set mixed_precision='fp16'")
    return NoPrecision(device, autocast)
