"""e2e worker: Accelerator() picks up the launcher's settings and trains one accumulated step."""

from __future__ import annotations

import json
import os

import torch

from accel import Accelerator


def main() -> None:
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    gen = torch.Generator().manual_seed(accelerator.process_index)
    for _ in range(accelerator.gradient_accumulation_steps):
        with accelerator.accumulate(model):
            x = torch.randn(8, 4, generator=gen).to(accelerator.device)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    weights = accelerator.gather(accelerator.unwrap_model(model).weight.detach().reshape(1, -1))
    report = {"rank": accelerator.process_index, "world": accelerator.num_processes,
              "steps": accelerator.gradient_accumulation_steps,
              "mp": accelerator.mixed_precision, "device": accelerator.device.type,
              "same_weights": bool(torch.equal(weights[0], weights[-1]))}
    # one write() per line: ranks share the launcher's stdout and must not interleave
    os.write(1, ("RESULT " + json.dumps(report) + "\n").encode())
    accelerator.end_training()


if __name__ == "__main__":
    main()
