"""Sharded (FSDP) state in accel checkpoints, through torch's DCP; no process group needed to
read it back (``accel merge-weights``).

Layer L4, between the checkpoint storage (which it writes with) and the protocol (which calls
it). It uses ``torch.distributed.checkpoint`` (DCP) for sharding, planning and resharding and
never the Accelerator, strategies or preparation.

- :mod:`.layout`: where DCP state lives in a checkpoint (no ``torch.distributed`` import).
- :mod:`.dcp_io`: DCP storage writer/reader over accel's hashed, pickle-free files.
- :mod:`.states`: model and optimizer state in and out (sharded through DCP, or full).
- :mod:`.consolidate`: consolidated safetensors from sharded state (``save_model`` of an FSDP
  model, ``accel merge-weights``).
- :mod:`.command`: the ``accel merge-weights`` command.

Only :mod:`.layout` is imported here: DCP and FSDP are imported by the runs that use them.
"""

from __future__ import annotations

from .layout import SHARDED_DIR, ShardedFiles, has_shards, model_prefix, optimizer_prefix

__all__ = ["SHARDED_DIR", "ShardedFiles", "has_shards", "model_prefix", "optimizer_prefix"]
