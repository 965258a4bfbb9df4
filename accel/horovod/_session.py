"""The Horovod session of this process: ``hvd.init()`` installs it, ``hvd.shutdown()`` removes it.

Horovod's API is a set of module functions (``hvd.rank()``, ``hvd.allreduce(...)``) over one
per-process runtime, so ``accel.horovod`` keeps exactly one :class:`Session` per process, in
the holder below. This is the one deliberate exception to "no module-level state" (DESIGN.md
§3.2): the session is a view over what is already once per process (torch's default process
group, the launcher's environment), started by the same connector path as ``Accelerator()`` and
``PartialState()`` (:func:`accel.run.connector.connect_process`), so an ``Accelerator`` in the same
script adopts the group ``hvd.init()`` started, and the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..distributed import Communicator, ProcessContext
from ..run.connector import ProcessSetup

__all__ = ["NOT_INITIALIZED", "Session", "current", "installed", "install", "uninstall"]

#: Horovod's own words, so that scripts and tests matching on them keep working.
NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


# Not slotted: hvd.SyncBatchNorm keeps a weakref to the session, and weakref_slot=True needs
# Python 3.11 (accel supports 3.10).
@dataclass(kw_only=True)
class Session:
    """What ``hvd.init()`` set up: the process (context, group, launch info) and its sets.

    ``process_sets`` maps a process set id to its :class:`~accel.horovod.process_sets.ProcessSet`
    (id 0 is the global set); ``extras`` is where other parts of ``accel.horovod`` cache
    per-session objects (e.g. the per-node process groups of SyncBatchNorm), keyed by name, so
    they are created once per session and dropped with it.
    """

    setup: ProcessSetup
    comm: Communicator
    process_sets: dict[int, Any] = field(default_factory=dict)  # id -> ProcessSet
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def context(self) -> ProcessContext:
        return self.setup.context

    @property
    def device(self) -> torch.device:
        return self.setup.context.device

    def next_process_set_id(self) -> int:
        return max(self.process_sets, default=0) + 1


class _Holder:
    """The one per-process slot (see the module docstring for why it exists)."""

    session: Session | None = None


_HOLDER = _Holder()


def current() -> Session:
    """The running session; ``ValueError`` (Horovod's type and words) before ``hvd.init()``."""
    session = _HOLDER.session
    if session is None:
        raise ValueError(NOT_INITIALIZED)
    return session


def installed() -> Session | None:
    """The running session, or None."""
    return _HOLDER.session


def install(session: Session) -> None:
    _HOLDER.session = session


def uninstall() -> Session | None:
    """Remove and return the running session (None when there is none)."""
    session, _HOLDER.session = _HOLDER.session, None
    return session
