"""XLA (torch_xla / PJRT): lazy tensors need ``mark_step``; multi-process reduces gradients."""

from __future__ import annotations

import torch
from torch import nn

from .._base import optional as _optional
from .._base.warn import warn_user
from ..device.xla import mark_step
from .base import Strategy, SyncSetting, as_batchnorm_sync

__all__ = ["XLAStrategy"]


class XLAStrategy(Strategy):
    name = "xla"

    def wrap_model(self, model: nn.Module, sync_batchnorm: SyncSetting = False) -> nn.Module:
        return self._convert_and_place(model, sync_batchnorm)

    def convert_batchnorm(self, model: nn.Module, sync_batchnorm: SyncSetting) -> nn.Module:
        """SyncBatchNorm is not offered on XLA: the layers stay as they are (one warning)."""
        if as_batchnorm_sync(sync_batchnorm) is not None and self.ctx.is_distributed and \
                self.ctx.is_main_process:
            warn_user("sync_batchnorm is not supported on XLA: BatchNorm layers are left "
                      "as they are (each process normalises its own batch); drop "
                      "sync_batchnorm, or train on CUDA or CPU to synchronise them")
        return model

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
