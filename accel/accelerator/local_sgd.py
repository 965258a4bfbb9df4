"""Local SGD: ranks train on their own and average their parameters every few steps.

Inside the block DDP does not all-reduce gradients (the strategy's ``no_sync``), so each rank's
optimizer steps on its local gradients; every ``local_sgd_steps`` calls of :meth:`LocalSGD.step`,
and once more when the block ends, every parameter is replaced by its mean across ranks (one
all-reduce per dtype, through the accelerator's communicator). Communication drops by a factor
of ``local_sgd_steps`` at the price of ranks drifting apart in between.

Example:
    >>> import torch
    >>> from accel import Accelerator
    >>> accelerator = Accelerator(cpu=True)
    >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
    >>> with LocalSGD(accelerator, model, local_sgd_steps=4) as local_sgd:
    ...     for _ in range(8):
    ...         local_sgd.step()
    >>> local_sgd.num_steps
    8
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .facade import Accelerator

__all__ = ["LocalSGD"]


class LocalSGD:
    """Run local optimizer steps and average the model across ranks every ``local_sgd_steps``.

    Args:
        accelerator: the ``Accelerator`` that prepared ``model``.
        model: the prepared model.
        local_sgd_steps: steps between two averagings (>= 1).
        enabled: False makes the block and ``step()`` do nothing (as does a one-process job).

    Raises:
        NotImplementedError: with FSDP (ranks hold shards, not replicas) or on XLA, where accel
            has no per-rank no-sync to train locally.
        ValueError: ``local_sgd_steps`` is not an integer >= 1.
    """

    def __init__(self, accelerator: Accelerator, model: nn.Module, local_sgd_steps: int,
                 enabled: bool = True) -> None:
        strategy = accelerator._rt.strategy
        if not strategy.replicates_model:  # its ranks must hold whole replicas to average
            raise NotImplementedError(
                f"LocalSGD supports one process and DDP on CPU/GPU, not the {strategy.name} "
                "strategy; train without LocalSGD there")
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) \
                or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be an integer >= 1, got {local_sgd_steps!r}")
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.enabled = enabled and strategy.ctx.is_distributed
        self.num_steps = 0
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            if self._stack is not None:
                raise RuntimeError("this LocalSGD block is already open; enter it once")
            self._stack = contextlib.ExitStack()
            self._stack.enter_context(self.accelerator.no_sync(self.model))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._stack is None:
            return
        stack, self._stack = self._stack, None
        with stack:
            if exc_type is None:  # on an error, skip the collective: other ranks may not come
                self._average()

    def step(self) -> None:
        """Count one optimizer step; average the parameters every ``local_sgd_steps`` steps."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    def _average(self) -> None:
        params = list(self.model.parameters())
        if not params:
            return
        means = self.accelerator.reduce([p.detach() for p in params], reduction="mean")
        with torch.no_grad():
            for param, mean in zip(params, means, strict=True):
                param.copy_(mean)
