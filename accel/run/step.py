"""The training step: backward with scaling and accumulation, gradient clipping.

``StepController`` owns nothing global; the Accelerator creates one and delegates to it.

Example:
    >>> import torch
    >>> from accel import Accelerator
    >>> acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    >>> model = acc.prepare(torch.nn.Linear(2, 1))
    >>> with acc.accumulate(model):
    ...     acc.backward(model(torch.ones(1, 2)).sum())
    >>> acc.sync_gradients
    False
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..data import override_even_batches
from ..distributed import Communicator
from ..precision import Precision
from ..strategy import Strategy
from .state import RunState

__all__ = ["StepController"]


def _nothing() -> None:
    pass


class StepController:
    """Backward, accumulation and clipping for one Accelerator."""

    def __init__(self, precision: Precision, strategy: Strategy, run: RunState,
                 comm: Communicator, progress: Callable[[], None] | None = None) -> None:
        self.precision = precision
        self.strategy = strategy
        self.run = run
        self.comm = comm
        #: called as each backward starts and ends (the collective monitor's progress mark)
        self.progress = progress or _nothing

    @contextlib.contextmanager
    def accumulate(self, models: tuple[nn.Module, ...]) -> Iterator[None]:
        acc = self.run.accumulation
        acc.begin_micro_step(self.run.data.end_of_dataloader)
        with contextlib.ExitStack() as stack:
            if not acc.sync_gradients and not acc.sync_each_batch:
                for model in models or self.run.models:
                    stack.enter_context(self.strategy.no_sync(model))
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], *, even_batches: bool | None,
                           default_even: bool) -> Iterator[None]:
        """torch ``Join`` over ``joinables`` when batches are uneven, as Accelerate has it: with
        ``even_batches`` given, the prepared map-style loaders use it inside the block (several
        DDP processes only), and Join is enabled only when batches are not evened out."""
        even = default_even if even_batches is None else bool(even_batches)
        with contextlib.ExitStack() as stack:
            if even_batches is not None and self.strategy.joins_uneven_inputs:
                stack.enter_context(override_even_batches(self.run.dataloaders, even=even))
            stack.enter_context(self.strategy.join(joinables, enable=not even))
            yield

    def backward(self, loss: torch.Tensor, num_items: float | int | torch.Tensor | None,
                 **kwargs: Any) -> None:
        acc = self.run.accumulation
        use_items = num_items is not None
        if acc.uses_num_items is not None and acc.uses_num_items != use_items:
            raise ValueError("backward() was called with and without num_items in one "
                             "accumulation group; use one style for every micro-batch")
        acc.uses_num_items = use_items
        if num_items is not None:
            acc.items += float(num_items.item() if isinstance(num_items, torch.Tensor)
                               else num_items)
        else:
            loader = self.run.data.active
            weight = acc.loss_weight(loader.current_batch_len if loader is not None else 1)
            if weight != 1.0:
                loss = loss * weight
        self.progress()
        self.precision.backward(loss, **kwargs)
        if acc.sync_gradients:
            factor = self._items_factor() if use_items else acc.correction()
            if factor != 1.0:
                self._scale_gradients(factor)
        self.strategy.after_backward()
        self.progress()

    def _items_factor(self) -> float:
        # DDP averages gradients over ranks, so multiply back by the world size.
        device = self.comm.ctx.device
        local = torch.tensor([self.run.accumulation.items], dtype=torch.float64, device=device)
        total = float(self.comm.reduce(local, "sum")[0])
        if total <= 0:
            raise ValueError("num_items summed to 0 over the accumulation group; pass the "
                             "number of items (e.g. tokens) that each loss sums over")
        return self.comm.ctx.world_size / total

    def _scale_gradients(self, factor: float) -> None:
        with torch.no_grad():
            for model in self.run.models:
                for param in model.parameters():
                    if param.grad is not None:
                        param.grad.mul_(factor)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        targets = self.run.optimizers if optimizer is None else [optimizer]
        for opt in targets:
            self.precision.unscale_(getattr(opt, "optimizer", opt))

    def clip_grad_norm_(self, parameters: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor | None:
        if not self.run.accumulation.sync_gradients:
            return None
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        if not self.run.accumulation.sync_gradients:
            return
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)
