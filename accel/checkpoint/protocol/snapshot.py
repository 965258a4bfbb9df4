"""What the protocol needs from a run: a frozen snapshot, built by the caller at each call.

The protocol never reaches into the Accelerator: the facade (or any other front door) hands it a
:class:`RunSnapshot` of what it prepared and registered, and applies the :class:`LoadedRun` that
``load_run`` returns to its own run state.

See :mod:`accel.checkpoint.protocol` for an example that builds one and saves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from ...device import Device

__all__ = ["FileQueue", "LoadHook", "LoadedRun", "ModelStateIO", "ResumableLoader", "RunSnapshot",
           "SaveHook", "Stateful", "check_registrable", "component_counts", "restored_loaders"]

#: ``hook(models, weights, output_dir)``, Accelerate's ``register_save_state_pre_hook``: called on
#: every rank before the models are written; it may save models itself (into ``output_dir``,
#: the checkpoint's temporary directory) and pop their entries from ``weights``.
SaveHook = Callable[[list[nn.Module], list[dict[str, torch.Tensor]], str], None]
#: ``hook(models, input_dir)``, Accelerate's ``register_load_state_pre_hook``: called on every
#: rank before the models are loaded; it may load models itself and pop them from ``models``.
LoadHook = Callable[[list[nn.Module], str], None]


class FileQueue(Protocol):
    """Where a rank's files of one checkpoint are queued: a storage ``CheckpointWriter``, or
    a recorder that hands the calls to one later (a non-blocking save copies every state
    first, so that the writer's threads do not compete with the copies)."""

    @property
    def tmpdir(self) -> Path: ...

    def write_tensors(self, relpath: str, tensors: dict[str, torch.Tensor]) -> None: ...

    def write_state(self, stem: str, state: Any) -> None: ...


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint holds (optimizer, scheduler, loader, scaler, …)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], /) -> Any: ...


@runtime_checkable
class ResumableLoader(Stateful, Protocol):
    """A prepared data loader. Its position is always saved; ``load_run`` restores it only when
    ``use_stateful_dataloader`` is true (Accelerate's switch: without it Accelerate restores no
    loader, and scripts written for it skip the batches already seen by hand)."""

    @property
    def use_stateful_dataloader(self) -> bool: ...


class ModelStateIO(Protocol):
    """How a model's full state is read and written; implemented by the strategy.

    A sharded strategy (FSDP) gathers the full state here; the protocol only sees plain
    ``{name: tensor}`` dicts and never unwraps a model itself.
    """

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state of ``model`` (as prepared); tensors may be on any device."""
        ...

    def load_model_state_dict(self, model: nn.Module, *, state: dict[str, torch.Tensor],
                              strict: bool) -> Any:
        """Load ``state`` into ``model``; returns torch's ``_IncompatibleKeys`` or the like
        (an object with ``missing_keys`` and ``unexpected_keys``)."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSnapshot:
    """Everything ``save_run``/``load_run`` touch, as the run holds it at the call.

    Components are matched by position (``model_0``, ``optimizer_1``, …), so the same objects
    must be passed, in the same order, when saving and when loading.
    """

    models: tuple[nn.Module, ...]  # as prepared (possibly wrapped); only used through model_io
    optimizers: tuple[Stateful, ...]
    schedulers: tuple[Stateful, ...]
    loaders: tuple[ResumableLoader, ...]
    custom: tuple[Stateful, ...]  # register_for_checkpointing objects
    scaler: Stateful  # precision state; state_dict() == {} means "none" (nothing written)
    model_io: ModelStateIO
    device: Device  # for the device's RNG state
    accumulation_step: int
    accumulation_steps: int  # micro-steps per group, for the mid-group warning
    sync_gradients: bool
    optimizer_steps: int
    loaded_dir: Path | None  # the checkpoint loaded last: never rotated away
    save_hooks: tuple[SaveHook, ...] = ()
    load_hooks: tuple[LoadHook, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedRun:
    """What ``load_run`` restored that lives in the caller's run state (it applies these)."""

    path: Path
    accumulation_step: int
    optimizer_steps: int


def check_registrable(obj: object) -> Stateful:
    """``obj`` itself if it can be checkpointed (has ``state_dict`` and ``load_state_dict``).

    Raises:
        TypeError: it lacks one of them.
    """
    if not (callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))):
        raise TypeError(f"{type(obj).__name__} has no state_dict()/load_state_dict(); "
                        "only such objects can be registered for checkpointing")
    return obj  # type: ignore[return-value]  # checked structurally above


def restored_loaders(snap: RunSnapshot) -> bool:
    """Whether ``load_run`` reads loader positions: when any loader asks for it (positions are
    matched by index, so the numbers of loaders must then agree; each loader that asks is
    restored)."""
    return any(loader.use_stateful_dataloader for loader in snap.loaders)


def component_counts(snap: RunSnapshot) -> dict[str, int]:
    """How many components of each kind ``snap`` has (stored in the manifest, checked on load)."""
    return {"models": len(snap.models), "optimizers": len(snap.optimizers),
            "schedulers": len(snap.schedulers), "loaders": len(snap.loaders),
            "custom": len(snap.custom)}
