"""What a training run saves and restores, and how every rank agrees on it.

Layer L4. Depends only on a :class:`RunSnapshot` that the caller builds, the communicator
(:class:`accel.distributed.Communicator`), :mod:`accel.run.rng` and
:mod:`accel.checkpoint.storage`; it never calls back into the Accelerator. ``load_run`` returns
a :class:`LoadedRun` that the caller applies to its own run state.

Example:
    >>> import tempfile, torch
    >>> from accel.device import select_device
    >>> from accel.distributed import Communicator, ProcessContext
    >>> comm = Communicator(ProcessContext.single())
    >>> class PlainIO:
    ...     def model_state_dict(self, model): return model.state_dict()
    ...     def load_model_state_dict(self, model, state, strict):
    ...         return model.load_state_dict(state, strict=strict)
    >>> class NoScaler:
    ...     def state_dict(self): return {}
    ...     def load_state_dict(self, state): pass
    >>> snap = RunSnapshot(models=(torch.nn.Linear(2, 2),), optimizers=(), schedulers=(),
    ...                    loaders=(), custom=(), scaler=NoScaler(), model_io=PlainIO(),
    ...                    device=select_device(cpu=True), accumulation_step=0,
    ...                    accumulation_steps=1, sync_gradients=True, optimizer_steps=0,
    ...                    loaded_dir=None)
    >>> project = tempfile.mkdtemp()
    >>> save_run(comm, snap=snap, output_dir=None, total_limit=None, project_dir=project,
    ...          project_total_limit=None).name
    'checkpoint_0'
    >>> load_run(comm, snap=snap, input_dir=None, project_dir=project, strict=True).path.name
    'checkpoint_0'
"""

from __future__ import annotations

from .background import BackgroundSaves, host_copy
from .load import load_run
from .save import save_run
from .snapshot import (
    LoadedRun,
    LoadHook,
    ModelStateIO,
    ResumableLoader,
    RunSnapshot,
    SaveHook,
    Stateful,
    check_registrable,
    component_counts,
    restored_loaders,
)

__all__ = ["BackgroundSaves", "LoadHook", "LoadedRun", "ModelStateIO", "ResumableLoader",
           "RunSnapshot", "SaveHook", "Stateful", "check_registrable", "component_counts",
           "host_copy", "load_run", "restored_loaders", "save_run"]
