"""XLA (torch_xla / PJRT): lazy tensors need ``mark_step``; multi-process reduces gradients."""

from __future__ import annotations

import torch

from .. import _optional
from ..device.xla import mark_step
from .base import Strategy

__all__ = ["XLAStrategy"]


class XLAStrategy(Strategy):
    name = "xla"

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.ctx.is_distributed:
            xm = _optional.require("torch_xla.core.xla_model", extra="xla")
            xm.reduce_gradients(optimizer)

    def after_optimizer_step(self) -> None:
        mark_step()
