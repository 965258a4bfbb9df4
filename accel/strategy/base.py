"""How a model is wrapped and how gradients are synchronised."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from ..config import DistributedDataParallelKwargs
from ..distributed import ProcessContext

__all__ = ["Strategy", "unwrap_module"]


def unwrap_module(model: nn.Module) -> nn.Module:
    """Strip DDP / torch.compile wrappers and return the user's module."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
    return model


class Strategy:
    """Single device: move the model, nothing to synchronise."""

    name = "single"

    def __init__(self, ctx: ProcessContext, place: bool = True,
                 ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        self.ctx = ctx
        self.place = place
        self.ddp_kwargs = ddp_kwargs or DistributedDataParallelKwargs()

    def wrap_model(self, model: nn.Module, sync_batchnorm: bool = False) -> nn.Module:
        if sync_batchnorm and self.ctx.is_distributed:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        if self.place:
            model = model.to(self.ctx.device)
        return model

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient synchronisation in backward (accumulation micro-steps)."""
        return contextlib.nullcontext()

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook before the optimizer steps (e.g. reduce gradients on XLA)."""

    def after_optimizer_step(self) -> None:
        """Hook after the optimizer stepped (e.g. XLA's mark_step)."""

    def after_backward(self) -> None:
        """Hook after each backward pass."""
