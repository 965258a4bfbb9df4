"""The Accelerator's checkpointing state: registered objects, the last loaded checkpoint, and
the checks around ``save_state``/``load_state`` (the protocol itself is in :mod:`.state`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..accumulation import AccumulationState
from ..config import ProjectConfiguration
from ..device import Device
from ..distributed import Communicator
from ..precision import Precision
from ..preparation import Preparer
from .state import StateObjects, load_accelerator_state, save_accelerator_state

__all__ = ["Checkpointer"]


@dataclass
class Checkpointer:
    """Saves and restores everything one Accelerator prepared or registered."""

    comm: Communicator
    prep: Preparer
    precision: Precision
    device: Device
    accumulation: AccumulationState
    project: ProjectConfiguration
    unwrap: Callable[[Any], torch.nn.Module]
    custom: list[Any] = field(default_factory=list)
    loaded_dir: Path | None = None

    def register(self, objects: tuple[Any, ...]) -> None:
        for obj in objects:
            if not (callable(getattr(obj, "state_dict", None))
                    and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"{type(obj).__name__} has no state_dict()/load_state_dict(); "
                                "only such objects can be registered for checkpointing")
            self.custom.append(obj)

    def _optimizer_steps(self) -> int:
        return max((opt.steps_taken for opt in self.prep.optimizers), default=0)

    def _objects(self) -> StateObjects:
        p = self.prep
        return StateObjects(p.models, p.optimizers, p.schedulers, p.dataloaders, self.custom,
                            self.precision, self.device,
                            {"accumulation_step": self.accumulation.step,
                             "optimizer_steps": self._optimizer_steps()})

    def save(self, output_dir: str | None, total_limit: int | None,
             unsupported: dict[str, Any]) -> str:
        if unsupported:
            raise TypeError(f"save_state() got unsupported arguments {sorted(unsupported)}; "
                            "accel always writes safetensors + JSON")
        main = self.comm.ctx.is_main_process
        if output_dir is not None and total_limit is not None and main:
            warnings.warn(f"save_state(total_limit={total_limit}) is ignored with an explicit "
                          "output_dir: rotation applies to automatically named checkpoints "
                          "(omit output_dir and set Accelerator(project_dir=...))", stacklevel=3)
        acc = self.accumulation
        if not acc.sync_gradients and main:
            warnings.warn(f"save_state() in the middle of a gradient accumulation group (micro-"
                          f"step {acc.step} of {acc.num_steps}): the gradients accumulated so far "
                          "are not saved, so a run resumed from it is not exact; save after the "
                          "group's optimizer.step()", stacklevel=3)
        limit = total_limit if total_limit is not None else self.project.total_limit
        path = save_accelerator_state(
            self.comm, self._objects(), output_dir, self.project.project_dir, limit,
            [self.loaded_dir] if self.loaded_dir else [], self._optimizer_steps(), self.unwrap)
        return str(path)

    def load(self, input_dir: str | None, strict: bool, missing_ok: bool) -> str | None:
        loaded = load_accelerator_state(self.comm, self._objects(), input_dir,
                                        self.project.project_dir, strict, self.unwrap, missing_ok)
        if loaded is None:
            return None
        path, manifest = loaded
        self.accumulation.step = int(manifest.meta.get("accumulation_step", 0))
        for opt in self.prep.optimizers:
            opt.steps_taken = int(manifest.meta.get("optimizer_steps", 0))
        self.loaded_dir = path
        return str(path)
