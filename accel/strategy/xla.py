"""XLA (torch_xla / PJRT): lazy tensors need ``mark_step``; multi-process reduces gradients."""

from __future__ import annotations

import torch
from torch import nn

from .. import _optional
from ..config import DistributedType
from ..device.xla import mark_step
from .base import Strategy

__all__ = ["XLAStrategy"]


class XLAStrategy(Strategy):
    name = "xla"

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.XLA  # one process or many, as Accelerate reports it

    def wrap_model(self, model: nn.Module, sync_batchnorm: bool = False) -> nn.Module:
        return self._convert_and_place(model, sync_batchnorm)

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        # Moving a module to XLA replaces its parameter objects, so an optimizer built before
        # the move would silently train stale CPU copies.
        if not self.place:
            return
        stale = [p for g in optimizer.param_groups for p in g["params"]
                 if p.device.type != self.ctx.device.type]
        if stale:
            raise ValueError(
                f"{len(stale)} optimizer parameter(s) are not on {self.ctx.device}; pass the "
                "model and its optimizer to the same prepare() call, or create the "
                "optimizer after prepare(model)")

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.ctx.is_distributed:
            xm = _optional.require("torch_xla.core.xla_model", extra="xla")
            xm.reduce_gradients(optimizer)

    def after_optimizer_step(self) -> None:
        mark_step()
