"""Checkpoints: a storage library and the protocol a training run uses on top of it.

Layer L4, in three parts:

- :mod:`.storage`: atomic, pickle-free directories and safetensors files; no collectives, no
  knowledge of runs. Usable on its own; its names are re-exported here (``accel.save`` and
  ``accel.load`` come from it).
- :mod:`.protocol`: what a run saves and restores on every rank (``save_run``/``load_run`` on a
  :class:`~accel.checkpoint.protocol.RunSnapshot`); the :class:`~accel.Accelerator` calls it
  in ``save_state``/``load_state``.
- :mod:`.convert`: Accelerate ``save_state`` directories -> accel checkpoints, written with the
  storage's writer (:func:`convert_accelerate_checkpoint`, ``accel convert-checkpoint``).

Example (the storage's own docstring shows it at work; here its names are the same objects):
    >>> from accel.checkpoint import storage
    >>> save is storage.save and CheckpointWriter is storage.CheckpointWriter
    True
"""

from __future__ import annotations

# Everything each part exports, re-exported here: one list per part, kept in that part.
from . import convert as _convert
from . import protocol as _protocol
from . import storage as _storage
from .convert import *  # noqa: F403
from .protocol import *  # noqa: F403
from .storage import *  # noqa: F403

__all__ = [*_storage.__all__, *_protocol.__all__, *_convert.__all__]
