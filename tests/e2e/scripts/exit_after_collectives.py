"""Worker that ends right after a collective: the interpreter exits while gloo's worker threads
may still hold the last collective's tensors. Plain torch.distributed aborts here about half the
time on two busy cores ("terminate called without an active exception"); accel must not."""

import torch
import torch.distributed as dist

from accel import Accelerator

accelerator = Accelerator(cpu=True)
model = accelerator.prepare(torch.nn.Linear(3, 3))
total = torch.ones(3)
for _ in range(4):
    dist.all_reduce(total)
print(f"rank {accelerator.process_index} done {total.tolist()}", flush=True)
# the last statement: issued by the user directly, so no accel code and no output after it
# (anything that releases the GIL here would hide the race)
dist.all_reduce(total)
