"""Started by torchrun in tests/e2e/test_torchrun.py: build the context with accel, report it.

Prints one line ``PROBE {json}`` per rank: what accel detected, what torch.distributed says, and
the result of an all_reduce of ``rank + 1``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from accel.device import select_device
from accel.distributed import build_context, start_process_group
from accel.env import detect_launch

__all__: list[str] = []


def main() -> int:
    info = detect_launch()
    device = select_device(cpu="--cpu" in sys.argv)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device, timeout=timedelta(seconds=60))
    value = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(value)
    report = {
        "launcher": info.launcher, "rank": ctx.rank, "world": ctx.world_size,
        "local_rank": ctx.local_rank, "backend": ctx.backend, "device": str(ctx.device),
        "use_agent_store": info.use_agent_store, "dist_rank": dist.get_rank(),
        "dist_world": dist.get_world_size(), "dist_backend": str(dist.get_backend()),
        "all_reduce": value.item(), "owned": group.owned,
    }
    dist.barrier()
    group.close()
    report["closed"] = not dist.is_initialized()
    # one write(2) per line: print() writes the text and the newline separately, so lines of
    # two ranks sharing a pipe can interleave
    os.write(1, ("PROBE " + json.dumps(report) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
