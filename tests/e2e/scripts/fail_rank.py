"""e2e worker for the failure drills: ``fail_rank.py <mode> <pid dir>``.

Every rank starts two DataLoader worker processes and writes its own pid and theirs to
``<pid dir>/<rank>-<name>.pid`` (so the test can check that none survives), trains a few steps,
then rank 1 misbehaves according to ``mode``:

- ``raise``: raises ValueError in ``explode()``;
- ``sigkill``: SIGKILLs itself (no Python traceback possible);
- ``hang``: sleeps forever outside any collective while rank 0 waits in wait_for_everyone();
- ``idle``: nobody misbehaves; every rank loops until the launcher is signalled or killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader

from accel import Accelerator

MODE, PID_DIR = sys.argv[1], sys.argv[2]


def record(name: str) -> None:
    path = os.path.join(PID_DIR, f"{os.environ.get('RANK', '0')}-{name}.pid")
    with open(path + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def explode(rank: int) -> None:
    raise ValueError(f"boom from rank {rank}")


def main() -> None:
    accelerator = Accelerator(cpu=True)
    record("rank")
    loader = DataLoader(list(range(1000)), batch_size=2, num_workers=2, persistent_workers=True,
                        worker_init_fn=lambda i: record(f"loader{i}"))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = iter(loader)
    for _ in range(3):
        batch = next(batches).float().reshape(1, 2)
        accelerator.backward(model(batch).sum())
        optimizer.step()
        optimizer.zero_grad()
    expected = 3 * accelerator.num_processes  # every rank and its two loader workers
    while len([n for n in os.listdir(PID_DIR) if n.endswith(".pid")]) < expected:
        time.sleep(0.05)
    accelerator.wait_for_everyone()
    os.write(1, f"READY {accelerator.process_index}\n".encode())  # one write: no interleaving
    rank = accelerator.process_index
    if MODE == "raise" and rank == 1:
        explode(rank)
    if MODE == "sigkill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if MODE == "hang" and rank == 1:
        while True:
            time.sleep(1)  # stuck outside any collective (a deadlock, a slow filesystem...)
    while True:
        accelerator.wait_for_everyone()
        next(batches)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
