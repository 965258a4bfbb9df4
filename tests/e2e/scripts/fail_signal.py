"""e2e worker: trains until the launcher is signalled; the on_signal handler saves once.

argv: <project dir>. Every rank appends ``<rank> <step> <signal>`` to <project>/handled.txt
from its handler, so the test can check it ran exactly once per rank, at the same step.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from accel import Accelerator


def main() -> None:
    project = sys.argv[1]
    accelerator = Accelerator(cpu=True, project_dir=project)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    step = 0

    def save(signum: int) -> None:
        path = accelerator.save_state()
        with open(os.path.join(project, "handled.txt"), "a") as fh:
            fh.write(f"{accelerator.process_index} {step} {signum} {os.path.basename(path)}\n")

    accelerator.on_signal(save)
    accelerator.wait_for_everyone()
    os.write(1, f"READY {accelerator.process_index} {os.getpid()}\n".encode())
    while True:
        step += 1
        loss = model(torch.randn(8, 4)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.check_signal()  # a cheap sync point: the handler runs here on every rank
        time.sleep(0.02 * (1 + accelerator.process_index))  # ranks run at different speeds


if __name__ == "__main__":
    main()
