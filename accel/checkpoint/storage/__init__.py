"""Checkpoint storage: atomic, pickle-free directories and safetensors files.

Layer L4, but a library with no knowledge of training runs: it imports nothing from accel
but ``accel._base`` (L0) and knows no collectives, process groups or Accelerator. What a run saves
and restores, and how ranks agree on it, is :mod:`accel.checkpoint.protocol`.

- :mod:`.codec`: nested state (optimizer, scheduler, RNG, …) <-> tensors + JSON structure.
- :mod:`.format`: write a checkpoint directory atomically (temp dir, fsync, manifest, rename).
- :mod:`.reader`: manifest, completeness, verification, verified component loading.
- :mod:`.naming`: ``checkpoint_<n>`` names, newest complete checkpoint, rotation.
- :mod:`.files`: single safetensors files (``save``/``load``) and sharded ``save_model``.

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

from ._io import FileRecord, new_token
from .codec import decode, encode
from .errors import CheckpointError
from .files import (
    ModelFilesWriter,
    load,
    load_model,
    load_model_state,
    parse_size,
    plan_shards,
    save,
    save_model,
)
from .format import (
    FORMAT_VERSION,
    MANIFEST,
    CheckpointWriter,
    finalize,
    remove_checkpoint,
    temp_dir_for,
    write_json,
    write_state,
    write_tensors,
)
from .naming import (
    checkpoint_number,
    checkpoints_root,
    complete_checkpoints,
    latest_complete,
    next_checkpoint_name,
    rotate,
)
from .reader import (
    CheckpointReader,
    Manifest,
    is_complete,
    load_component,
    load_json,
    load_tensors,
    read_manifest,
    read_state,
    verify,
)

__all__ = [
    "FORMAT_VERSION", "MANIFEST", "CheckpointError", "CheckpointReader", "CheckpointWriter",
    "FileRecord", "Manifest", "ModelFilesWriter", "checkpoint_number", "checkpoints_root",
    "complete_checkpoints", "decode", "encode", "finalize", "is_complete", "latest_complete",
    "load", "load_component", "load_json", "load_model", "load_model_state", "load_tensors",
    "new_token", "next_checkpoint_name", "parse_size", "plan_shards", "read_manifest",
    "read_state", "remove_checkpoint", "rotate", "save", "save_model", "temp_dir_for", "verify",
    "write_json", "write_state", "write_tensors",
]
