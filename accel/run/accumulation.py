"""Gradient-accumulation state for one Accelerator (no globals).

A *group* is the run of micro-batches whose gradients add up to one optimizer step: normally
``num_steps`` micro-batches; the last group of an epoch may be shorter, and its last micro-batch
may hold fewer samples. The gradient of a group is the mean over the samples actually in it:
each micro-batch's mean loss is weighted by ``n_i / (num_steps * n_first)`` in backward (about
``1/num_steps``, so magnitudes stay as usual for fp16), and when the group closes the gradients
are multiplied by ``correction()`` = ``num_steps * n_first / sum(n_i)`` — exactly 1 for a full
group of equal micro-batches, so the steady state costs nothing.

Example:
    >>> s = AccumulationState(num_steps=2)
    >>> [s.begin_micro_step(end_of_dataloader=False) or s.sync_gradients for _ in range(4)]
    [False, True, False, True]
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.settings import GradientAccumulationPlugin

__all__ = ["AccumulationState"]


@dataclass(kw_only=True, slots=True)
class AccumulationState:
    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    #: micro-steps taken in the current group
    step: int = 0
    sync_gradients: bool = True
    #: samples of the group's first micro-batch, and of all its micro-batches so far
    first_samples: int = 0
    group_samples: int = 0
    #: items (e.g. tokens) passed to ``backward(num_items=...)`` in the current group, this rank
    items: float = 0.0
    uses_num_items: bool | None = None

    @classmethod
    def from_plugin(cls, plugin: GradientAccumulationPlugin) -> AccumulationState:
        """The state for ``plugin``'s settings (``num_steps=None`` means 1)."""
        return cls(num_steps=plugin.num_steps or 1, adjust_scheduler=plugin.adjust_scheduler,
                   sync_with_dataloader=plugin.sync_with_dataloader,
                   sync_each_batch=plugin.sync_each_batch)

    def begin_micro_step(self, end_of_dataloader: bool) -> None:
        """Advance one micro-batch and decide whether gradients synchronise after it."""
        if self.sync_gradients:  # the previous group closed: start a new one
            self.step = 0
            self.first_samples = self.group_samples = 0
            self.items = 0.0
            self.uses_num_items = None
        self.step += 1
        at_end = self.sync_with_dataloader and end_of_dataloader
        self.sync_gradients = self.step >= self.num_steps or at_end

    def loss_weight(self, samples: int) -> float:
        """Multiplier for this micro-batch's mean loss (1.0 without accumulation)."""
        if self.num_steps == 1:
            return 1.0
        samples = max(int(samples), 1)
        if self.first_samples == 0:
            self.first_samples = samples
        self.group_samples += samples
        return samples / (self.num_steps * self.first_samples)

    def correction(self) -> float:
        """Factor for the accumulated gradients when the group closes (1.0 when full)."""
        if self.num_steps == 1 or self.group_samples == 0:
            return 1.0
        return self.num_steps * self.first_samples / self.group_samples
