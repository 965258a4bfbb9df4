"""``accel merge-weights CHECKPOINT_DIR OUTPUT_DIR``: the command around :func:`merge_weights`.

The arguments are parsed in :mod:`accel.launch.cli` (``--help`` never imports torch), which
calls :func:`run_merge`. One process, no process group. Exit status: 0 merged, 1 a damaged
checkpoint or a failed write, 2 a usage error (not a complete accel checkpoint, or one without
sharded model state).

Example::

    $ accel merge-weights runs/fsdp/checkpoints/checkpoint_3 runs/fsdp/merged
    model_0: 100%|██████████| 41.9M/41.9M
    wrote runs/fsdp/merged/model.safetensors
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..storage import MANIFEST, CheckpointError
from .consolidate import merge_weights

__all__ = ["run_merge"]

_PROG = "accel merge-weights"


def run_merge(checkpoint: str, *, output: str, max_shard_size: str = "10GB",
              progress: bool = True) -> int:
    """Merge, print what was written and return the exit status."""
    if not (Path(checkpoint) / MANIFEST).is_file():
        print(f"{_PROG}: error: {checkpoint} is not a complete accel checkpoint (no {MANIFEST}; "
              "an interrupted save leaves none): pass a checkpoint_<n> directory that "
              "save_state() finished", file=sys.stderr)
        return 2
    try:
        written = merge_weights(checkpoint, output=output, max_shard_size=max_shard_size,
                                progress=progress)
    except ValueError as exc:  # --max_shard_size
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        no_shards = "holds no sharded model state" in str(exc)
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2 if no_shards else 1
    except OSError as exc:
        print(f"{_PROG}: error: writing {output} failed: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0
