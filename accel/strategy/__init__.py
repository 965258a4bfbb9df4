"""Model-wrapping strategies, one file per implementation of :class:`Strategy`.

``select_strategy`` is the only place that branches on world size and device kind.
"""

from __future__ import annotations

from ..config import DistributedDataParallelKwargs
from ..distributed import ProcessContext
from .base import Strategy, no_join, strip_parallel, unwrap_module
from .ddp import DDPStrategy
from .single import SingleDeviceStrategy
from .xla import XLAStrategy

__all__ = ["DDPStrategy", "SingleDeviceStrategy", "Strategy", "XLAStrategy", "no_join",
           "select_strategy", "strip_parallel", "unwrap_module"]


def select_strategy(ctx: ProcessContext, place: bool = True,
                    ddp_kwargs: DistributedDataParallelKwargs | None = None) -> Strategy:
    """XLA devices get the XLA strategy; other multi-process jobs DDP; else a single device."""
    if ctx.device.type == "xla":
        return XLAStrategy(ctx, place, ddp_kwargs)
    if ctx.is_distributed:
        return DDPStrategy(ctx, place, ddp_kwargs)
    return SingleDeviceStrategy(ctx, place, ddp_kwargs)
