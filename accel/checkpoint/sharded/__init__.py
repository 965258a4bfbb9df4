"""Sharded (FSDP) state in accel checkpoints, through torch's DCP; no process group needed to
read it back (``accel merge-weights``).

Layer L4, between the checkpoint storage (which it writes with) and the protocol (which calls
it). It uses ``torch.distributed.checkpoint`` (DCP) for sharding, planning and resharding and
never the Accelerator, strategies or preparation.

- :mod:`.dcp_io`: DCP storage writer/reader over accel's hashed, pickle-free files.
- :mod:`.states`: model and optimizer state in and out (sharded through DCP, or full).
- :mod:`.merge`: consolidate a checkpoint's sharded models into safetensors, one process.
"""

from __future__ import annotations

from .dcp_io import SHARDED_DIR, ShardReader, ShardWriter, shard_files

__all__ = ["SHARDED_DIR", "ShardReader", "ShardWriter", "shard_files"]
