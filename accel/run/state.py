"""What changes during a run, owned in one place: accumulation, the active loader, the objects
``prepare()`` and ``register_for_checkpointing()`` registered, and small per-run counters.

One ``RunState`` belongs to one ``Accelerator``. It is passed explicitly to the collaborators
that read or change it (preparation, the training step, the optimizer and scheduler wrappers,
checkpointing) instead of each holding aliases of the same lists.

Example:
    >>> run = RunState(accumulation=AccumulationState(num_steps=2))
    >>> run.accumulation.num_steps, run.models, run.optimizer_steps
    (2, [], 0)
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from ..checkpoint.protocol import (
    BackgroundSaves,
    LoadHook,
    ModelStateIO,
    RunSnapshot,
    SaveHook,
    Stateful,
)
from ..data import DataTracker, PreparedDataLoader
from ..device import Device
from .accumulation import AccumulationState

__all__ = ["RunState", "SteppedOptimizer"]


class SteppedOptimizer(Protocol):
    """What the run state needs of a prepared optimizer (``AcceleratedOptimizer``)."""

    steps_taken: int
    step_was_skipped: bool

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass(kw_only=True, slots=True)
class RunState:
    """The mutable state of one run (one ``Accelerator``)."""

    accumulation: AccumulationState
    #: which prepared loader is being iterated (``end_of_dataloader``, ``gather_for_metrics``)
    data: DataTracker = field(default_factory=DataTracker)
    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[PreparedDataLoader] = field(default_factory=list)
    #: objects given to ``register_for_checkpointing``, in order
    custom: list[Any] = field(default_factory=list)
    #: ids of objects ``prepare()`` returned (preparing them again returns them unchanged)
    prepared_ids: set[int] = field(default_factory=set)
    #: the data-order seed every rank agreed on (set at the first prepared loader)
    data_seed: int | None = None
    #: the checkpoint loaded last (never rotated away)
    loaded_dir: Path | None = None
    #: ``register_save_state_pre_hook`` / ``register_load_state_pre_hook`` hooks by handle id
    #: (OrderedDicts: torch's RemovableHandle holds a weak reference to them)
    save_hooks: OrderedDict[int, SaveHook] = field(default_factory=OrderedDict)
    load_hooks: OrderedDict[int, LoadHook] = field(default_factory=OrderedDict)
    #: ``set_trigger`` was called on this rank since the last ``check_trigger``
    trigger: bool = False
    #: parameters a prepared model replaced (XLA placement, FSDP sharding): id of the old one ->
    #: (a weak reference to it, the new one). An optimizer prepared before or after its model is
    #: pointed at the new ones; the old ones are not kept alive (FSDP's would be a full copy of
    #: the model on every rank), and the weak reference tells a reused id from the old object.
    replaced: dict[int, tuple[weakref.ref[nn.Parameter], nn.Parameter]] = field(
        default_factory=dict)
    #: the save ``save_state(blocking=False)`` left finishing in the background (at most one)
    saves: BackgroundSaves = field(default_factory=BackgroundSaves)

    def __getstate__(self) -> dict[str, Any]:
        # A copy goes to another process (a DataLoader worker started with spawn that captured
        # the Accelerator): what was prepared and registered belongs to this process's training
        # (a DDP model cannot even be unpickled without a process group), so the copy has none.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("models", "optimizers", "schedulers", "dataloaders", "custom"):
            state[name] = []
        state.update(prepared_ids=set(), save_hooks=OrderedDict(), load_hooks=OrderedDict(),
                     replaced={})
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # slotted: no __dict__ for pickle's default to fill with the state above
        for name, value in state.items():
            setattr(self, name, value)

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken so far (the most of any prepared optimizer)."""
        return max((opt.steps_taken for opt in self.optimizers), default=0)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self.optimizers)

    def snapshot(self, scaler: Stateful, model_io: ModelStateIO, device: Device) -> RunSnapshot:
        """What ``save_state``/``load_state`` see of this run (the checkpoint protocol's input).

        Args:
            scaler: the precision policy (its state is the fp16 scaler's; ``{}`` otherwise).
            model_io: the strategy, which gathers and loads full model state dicts.
            device: the device kind, whose RNG state is saved per rank.
        """
        acc = self.accumulation
        return RunSnapshot(models=tuple(self.models), optimizers=tuple(self.optimizers),
                           schedulers=tuple(self.schedulers), loaders=tuple(self.dataloaders),
                           custom=tuple(self.custom), scaler=scaler, model_io=model_io,
                           device=device, accumulation_step=acc.step,
                           accumulation_steps=acc.num_steps, sync_gradients=acc.sync_gradients,
                           optimizer_steps=self.optimizer_steps, loaded_dir=self.loaded_dir,
                           save_hooks=tuple(self.save_hooks.values()),
                           load_hooks=tuple(self.load_hooks.values()))

    def restored(self, path: Path, accumulation_step: int, optimizer_steps: int) -> None:
        """Record what ``load_state`` restored that the objects themselves do not hold."""
        self.accumulation.step = accumulation_step
        for opt in self.optimizers:
            opt.steps_taken = optimizer_steps
        self.loaded_dir = path

    def clear(self) -> None:
        """Forget every prepared object (``free_memory``); registered objects stay."""
        for registry in (self.models, self.optimizers, self.schedulers, self.dataloaders):
            registry.clear()
        self.prepared_ids.clear()
        self.replaced.clear()
        self.saves.staging.clear()  # the host copies non-blocking saves reuse
