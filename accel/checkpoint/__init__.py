"""Checkpoints: a storage library and the protocol a training run uses on top of it.

Layer L4, in two parts:

- :mod:`.storage`: atomic, pickle-free directories and safetensors files; no collectives, no
  knowledge of runs. Usable on its own; its names are re-exported here (``accel.save`` and
  ``accel.load`` come from it).
- :mod:`.protocol`: what a run saves and restores on every rank (``save_run``/``load_run`` on a
  :class:`~accel.checkpoint.protocol.RunSnapshot`); the :class:`~accel.Accelerator` calls it
  in ``save_state``/``load_state``.

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

from .protocol import (
    LoadedRun,
    ModelStateIO,
    RunSnapshot,
    Stateful,
    check_registrable,
    load_run,
    save_run,
)
from .storage import (
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    CheckpointReader,
    CheckpointWriter,
    FileRecord,
    Manifest,
    checkpoint_number,
    checkpoints_root,
    complete_checkpoints,
    decode,
    encode,
    finalize,
    is_complete,
    latest_complete,
    load,
    load_component,
    load_json,
    load_model,
    load_model_state,
    load_tensors,
    new_token,
    next_checkpoint_name,
    parse_size,
    read_manifest,
    read_state,
    remove_checkpoint,
    rotate,
    save,
    save_model,
    temp_dir_for,
    verify,
    write_json,
    write_state,
    write_tensors,
)

__all__ = [
    # storage (unchanged since before the split)
    "FORMAT_VERSION", "MANIFEST", "CheckpointError", "CheckpointReader", "CheckpointWriter",
    "FileRecord", "Manifest", "checkpoint_number", "checkpoints_root", "complete_checkpoints",
    "decode", "encode", "finalize", "is_complete", "latest_complete", "load", "load_component",
    "load_json", "load_model", "load_model_state", "load_tensors", "new_token",
    "next_checkpoint_name", "parse_size", "read_manifest", "read_state", "remove_checkpoint",
    "rotate", "save", "save_model", "temp_dir_for", "verify", "write_json", "write_state",
    "write_tensors",
    # protocol
    "LoadedRun", "ModelStateIO", "RunSnapshot", "Stateful", "check_registrable", "load_run",
    "save_run",
]
