"""e2e worker: all-reduce through accel.distributed and report what this rank saw."""

from __future__ import annotations

import json
import os
import sys

import torch

from accel.device import select_device
from accel.distributed import Communicator, build_context, start_process_group
from accel.env import detect_launch, read_settings


def main() -> None:
    info = detect_launch()
    device = select_device(settings=read_settings())
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device)
    comm = Communicator(ctx)
    total = comm.reduce(torch.tensor([float(ctx.rank + 1)]), "sum").item()
    ranks = comm.gather(torch.tensor([ctx.rank])).tolist()
    report = {"rank": ctx.rank, "world": ctx.world_size, "sum": total, "ranks": ranks,
              "argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0],
              "device": device.kind, "launched": read_settings().launched,
              "omp": os.environ.get("OMP_NUM_THREADS"), "port": info.master_port,
              "mp": os.environ.get("ACCEL_MIXED_PRECISION")}
    # one write() per line: ranks share the launcher's stdout and must not interleave
    os.write(1, ("RESULT " + json.dumps(report) + "\n").encode())
    # plain print() from both ranks at once: accel launch keeps every line whole
    for i in range(int(os.environ.get("TEST_PRINT_LINES", "0"))):
        print(f"LINE {ctx.rank} {i} " + "x" * 60)
        print(f"ERRLINE {ctx.rank} {i} " + "y" * 60, file=sys.stderr)
    group.close()


if __name__ == "__main__":
    main()
