"""DistributedDataParallel over gloo (CPU) or nccl (CUDA)."""

from __future__ import annotations

import contextlib
from typing import Any

from torch import nn

from .base import Strategy

__all__ = ["DDPStrategy"]


class DDPStrategy(Strategy):
    name = "ddp"

    def wrap_model(self, model: nn.Module, sync_batchnorm: bool = False) -> nn.Module:
        model = super().wrap_model(model, sync_batchnorm)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # frozen (e.g. a teacher): DDP would refuse it, and nothing to sync
        kwargs = self.ddp_kwargs.to_kwargs()
        if self.ctx.device.type == "cuda":
            kwargs.update(device_ids=[self.ctx.device.index], output_device=self.ctx.device.index)
        return nn.parallel.DistributedDataParallel(model, **kwargs)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()
