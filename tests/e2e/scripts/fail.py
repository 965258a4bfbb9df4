"""e2e worker: rank 1 raises while rank 0 waits in a collective; both hold DataLoader workers.

Every DataLoader worker writes its pid to <pid dir>/<rank>-<worker>.pid so the test can check
that none of them survives the launcher.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.utils.data import DataLoader

from accel.device import select_device
from accel.distributed import Communicator, build_context, start_process_group
from accel.env import detect_launch

PID_DIR = sys.argv[1]


def record_pid(worker_id: int) -> None:
    with open(os.path.join(PID_DIR, f"{os.environ['RANK']}-{worker_id}.pid"), "w") as fh:
        fh.write(str(os.getpid()))


def explode(rank: int) -> None:
    raise ValueError(f"boom from rank {rank}")


def main() -> None:
    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    start_process_group(ctx, info=info, device=device)
    comm = Communicator(ctx)
    loader = DataLoader(list(range(64)), batch_size=2, num_workers=2, worker_init_fn=record_pid,
                        persistent_workers=True)
    batches = iter(loader)
    next(batches)  # both workers are running now
    while True:  # until every rank's workers have recorded their pids; decided together so
        #          that no rank leaves the loop (and calls another collective) alone
        ready = float(len(os.listdir(PID_DIR)) >= 2 * ctx.world_size)
        if comm.reduce(torch.tensor([ready]), "min").item() == 1.0:
            break
        time.sleep(0.05)
    if ctx.rank == 1:
        explode(ctx.rank)
    comm.reduce(torch.ones(1))  # rank 0 waits here for a peer that never comes


if __name__ == "__main__":
    main()
