"""Accelerate's ``accelerate.checkpointing``: save and load a run's states without an Accelerator.

``save_accelerator_state`` and ``load_accelerator_state`` take Accelerate's arguments and write
and read accel's own checkpoint: one atomic, manifest-checked directory of safetensors and JSON,
never pickle (the same format as ``Accelerator.save_state``, written by the same protocol,
:mod:`accel.checkpoint.protocol`). Call both on every process, with the objects in the same
order, as Accelerate's ``save_state`` does. Prepared data loaders (``DataLoaderShard``) save
their position; it is restored when the loader was prepared with
``use_stateful_dataloader=True`` (as ``load_state`` does). Other loaders hold no state here.

``CheckpointingMixin`` is the ``Accelerator``'s ``save_state``/``load_state`` half.

Example:
    >>> import tempfile, torch
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> folder = tempfile.mkdtemp() + "/ckpt"
    >>> path = save_accelerator_state(folder, [model.state_dict()], [optimizer], [], [],
    ...                               process_index=0, step=7)
    >>> load_accelerator_state(path, [torch.nn.Linear(2, 1)], [optimizer], [], [],
    ...                        process_index=0)
    {'step': 7}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from .._base.warn import warn_user
from ..accelerator.checkpoints import CheckpointingMixin
from ..checkpoint import ResumableLoader, RunSnapshot, Stateful, load_run, save_run
from ..distributed import Communicator
from ..run.connector import ProcessSetup, connect_process
from .operations import COMMUNICATORS

__all__ = ["CheckpointingMixin", "load_accelerator_state", "save_accelerator_state"]


class _StateDicts:
    """How the protocol reads and writes models here: ``save_accelerator_state`` is given state
    dicts (Accelerate's ``model_states``), ``load_accelerator_state`` modules."""

    def model_state_dict(self, model: Any) -> dict[str, torch.Tensor]:
        return dict(model) if isinstance(model, Mapping) else dict(model.state_dict())

    def load_model_state_dict(self, model: nn.Module, *, state: dict[str, torch.Tensor],
                              strict: bool) -> Any:
        return model.load_state_dict(state, strict=strict)


class _NoScaler:
    """No gradient scaler (``scaler=None``): nothing saved, nothing loaded."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], /) -> None:
        """Nothing to load."""


def _process(process_index: int) -> tuple[ProcessSetup, Communicator]:
    """This process (its group adopted, or started as ``PartialState()`` would) and the
    communicator the ranks agree over; ``process_index`` must be this process's rank."""
    setup = connect_process()
    ctx = setup.context
    if int(process_index) != ctx.rank:
        raise ValueError(f"process_index={process_index} but this process is rank {ctx.rank}; "
                         "pass accelerator.process_index (call it on every process)")
    comm = COMMUNICATORS.current(ctx) if ctx.is_distributed else Communicator(ctx)
    return setup, comm


def _snapshot(setup: ProcessSetup, *, models: list[Any], optimizers: list[Any],
              schedulers: list[Any], dataloaders: list[Any], scaler: Any, step: int
              ) -> RunSnapshot:
    loaders = tuple(dl for dl in dataloaders if isinstance(dl, ResumableLoader))
    return RunSnapshot(
        models=tuple(models), optimizers=tuple(cast(Stateful, o) for o in optimizers),
        schedulers=tuple(cast(Stateful, s) for s in schedulers), loaders=loaders, custom=(),
        scaler=_NoScaler() if scaler is None else cast(Stateful, scaler),
        model_io=_StateDicts(), device=setup.hardware, accumulation_step=int(step),
        accumulation_steps=1, sync_gradients=True, optimizer_steps=0, loaded_dir=None)


def save_accelerator_state(
    output_dir: str | os.PathLike[str],
    model_states: list[dict[str, torch.Tensor]],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    step: int,
    scaler: torch.amp.GradScaler | None = None,
    save_on_each_node: bool = False,
    safe_serialization: bool = True,
) -> Path:
    """Save model states, optimizers, schedulers, loader positions, the scaler and every
    process's RNG states to ``output_dir`` (Accelerate's function and arguments).

    ``step`` is returned by ``load_accelerator_state``. Tensors are always written with
    safetensors and everything else as JSON (``safe_serialization=False`` is ignored, with a
    warning: accel never pickles). Returns the checkpoint's directory.

    Raises:
        ValueError: ``process_index`` is not this process's rank.
        CheckpointError: a process could not write its part (raised on every process).
    """
    if not safe_serialization:
        warn_user("save_accelerator_state(safe_serialization=False) is ignored: accel writes "
                  "tensors with safetensors and never pickles; drop the argument")
    setup, comm = _process(process_index)
    snap = _snapshot(setup, models=list(model_states), optimizers=optimizers, schedulers=schedulers,
                     dataloaders=dataloaders, scaler=scaler,
                     step=step)
    return save_run(comm, snap=snap, output_dir=Path(output_dir), total_limit=None,
                    project_dir=None, project_total_limit=None,
                    save_on_each_node=save_on_each_node)


def load_accelerator_state(
    input_dir: str | os.PathLike[str],
    models: list[nn.Module],
    optimizers: list[Any],
    schedulers: list[Any],
    dataloaders: list[Any],
    process_index: int,
    scaler: torch.amp.GradScaler | None = None,
    map_location: str | None = None,
    load_kwargs: dict[str, Any] | None = None,
    **load_model_func_kwargs: Any,
) -> dict[str, Any]:
    """Load what ``save_accelerator_state`` (or ``Accelerator.save_state``) wrote into the
    given objects, in place, on every process (Accelerate's function and arguments).

    Returns the attributes to restore, ``{"step": step}``. ``map_location`` is accepted as in
    Accelerate (``"cpu"`` or ``"on_device"``): tensors are read on the CPU and each object's
    ``load_state_dict`` puts them where its parameters are. ``load_kwargs`` are
    ``torch.load``'s, which accel never calls: they are ignored with a warning. Of
    ``load_model_func_kwargs`` only ``strict`` (default True) applies.

    Raises:
        ValueError: ``process_index`` is not this process's rank, or ``map_location`` is
            neither ``"cpu"`` nor ``"on_device"``.
        TypeError: a model-loading keyword other than ``strict``.
        CheckpointError: a component is missing or corrupt, or the counts differ.
    """
    if map_location not in (None, "cpu", "on_device"):
        raise ValueError(f"map_location={map_location!r}: pass 'cpu' or 'on_device' (as in "
                         "Accelerate)")
    strict = bool(load_model_func_kwargs.pop("strict", True))
    if load_model_func_kwargs:
        raise TypeError(f"load_accelerator_state got {sorted(load_model_func_kwargs)}: of the "
                        "model-loading keywords accel takes only strict=")
    if load_kwargs:
        warn_user(f"load_accelerator_state(load_kwargs={load_kwargs!r}) is ignored: accel "
                  "checkpoints hold no pickle, so torch.load is never called")
    setup, comm = _process(process_index)
    snap = _snapshot(setup, models=list(models), optimizers=optimizers, schedulers=schedulers,
                     dataloaders=dataloaders, scaler=scaler, step=0)
    loaded = load_run(comm, snap=snap, input_dir=Path(input_dir), project_dir=None, strict=strict)
    assert loaded is not None  # an explicit directory: missing raises in load_run
    return {"step": loaded.accumulation_step}
