"""e2e worker for the two-machine drill: ``fail_node.py train`` or ``fail_node.py wait``.

Trains 5 DDP steps on rank-specific data and prints ``RESULT {...}`` (rank, world size, whether
every rank ended with the same weights, the gloo interface). With ``wait`` it then prints
``READY <rank> <pid>`` and loops in wait_for_everyone() until a peer dies.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from accel import Accelerator


def main() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    gen = torch.Generator().manual_seed(accelerator.process_index)
    for _ in range(5):
        loss = model(torch.randn(8, 4, generator=gen)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    weights = accelerator.gather(accelerator.unwrap_model(model).weight.detach().reshape(1, -1))
    rank = accelerator.process_index
    row = {"rank": rank, "world": accelerator.num_processes,
           "same_weights": bool(torch.equal(weights[0], weights[-1])),
           "gloo_if": os.environ.get("GLOO_SOCKET_IFNAME")}
    os.write(1, ("RESULT " + json.dumps(row) + "\n").encode())
    if sys.argv[1] == "wait":
        os.write(1, f"READY {rank} {os.getpid()}\n".encode())
        while True:
            accelerator.wait_for_everyone()
            time.sleep(0.1)
    accelerator.end_training()


if __name__ == "__main__":
    main()
