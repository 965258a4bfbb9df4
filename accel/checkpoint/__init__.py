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

Example:
    >>> import tempfile, torch
    >>> root = checkpoints_root(tempfile.mkdtemp())
    >>> writer = CheckpointWriter(next_checkpoint_name(root))
    >>> _ = writer.write_state("optimizer", {"state": {}, "param_groups": [{"lr": 0.1}]})
    >>> ckpt = writer.finalize(step=0, world_size=1)
    >>> latest_complete(root) == ckpt, read_state(ckpt, "optimizer")["param_groups"][0]["lr"]
    (True, 0.1)
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
