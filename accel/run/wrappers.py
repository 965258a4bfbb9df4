"""Prepared optimizer and scheduler wrappers.

``AcceleratedOptimizer.step()`` steps only when gradients synchronise (the last micro-batch of
an accumulation group), through the precision policy (fp16 GradScaler) and the strategy (XLA),
and records whether the fp16 scaler skipped the step. ``zero_grad()`` is a no-op on
accumulation micro-steps.

``AcceleratedScheduler.step()`` follows Hugging Face Accelerate's documented semantics, so a
migrated schedule behaves the same:

* it does nothing on accumulation micro-steps and when the optimizer step was skipped by the
  fp16 scaler;
* with ``split_batches=False`` each rank sees 1/num_processes of the batches per epoch, so the
  scheduler is stepped ``num_processes`` times per optimizer step (a schedule written for the
  single-process step count ends at the same epoch); with ``split_batches=True`` once;
* ``step_scheduler_with_optimizer=False`` steps it every time it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..precision import Precision
from ..strategy import Strategy
from .state import RunState

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler"]


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a user optimizer; attribute access falls through to it."""

    def __init__(self, optimizer: torch.optim.Optimizer, precision: Precision,
                 strategy: Strategy, run: RunState) -> None:
        # Deliberately not calling Optimizer.__init__: state lives on the wrapped optimizer.
        self.optimizer = optimizer
        self._precision = precision
        self._strategy = strategy
        self._run = run
        self.step_was_skipped = False
        self.steps_taken = 0

    @property
    def _is_overflow(self) -> bool:
        """Accelerate's name for ``step_was_skipped`` (its tests set it to fake a skipped fp16
        step); setting it sets ``step_was_skipped``, which the prepared schedulers read."""
        return self.step_was_skipped

    @_is_overflow.setter
    def _is_overflow(self, value: bool) -> None:
        self.step_was_skipped = bool(value)

    # Optimizer API --------------------------------------------------------------------------
    @property
    def state(self) -> Any:
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._run.accumulation.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        if not self._run.accumulation.sync_gradients:
            return None
        if closure is not None:
            raise ValueError("optimizer.step(closure) is not supported by prepared optimizers; "
                             "call the closure yourself (LBFGS-style closures re-run backward)")
        self._strategy.before_optimizer_step(self.optimizer)
        self.step_was_skipped = not self._precision.optimizer_step(self.optimizer)
        self._strategy.after_optimizer_step()
        self.steps_taken += 1
        return None

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not found normally (e.g. optimizer-specific ones).
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    # torch.optim.Optimizer's own pickling reads attributes that live on the wrapped optimizer
    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


class AcceleratedScheduler:
    """Wraps an LR scheduler so that it steps with the optimizer (see module docstring)."""

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer],
                 run: RunState, num_processes: int, split_batches: bool,
                 step_with_optimizer: bool = True) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self._run = run
        self.num_processes = num_processes
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self._run.accumulation.sync_gradients:
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else self.num_processes
        for _ in range(repeats):
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler._step_count > total:
                break  # OneCycleLR raises past its end (uneven last epoch without drop_last)
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return list(self.scheduler.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
