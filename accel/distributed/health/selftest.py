"""The worker side of ``accel test``: what each of the 2 launched CPU processes checks.

An all-reduce, an uneven gather, a broadcast and one DDP training step over gloo (gradients
averaged across ranks, parameters identical afterwards). Run by ``accel test`` (see
:mod:`accel.launch.selftest`) as ``accel launch --cpu -n 2 -m accel.distributed.health.selftest``.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from ...device import select_device
from ...env import detect_launch
from ..group import build_context, start_process_group
from ..ops import Communicator

__all__ = ["worker"]

_WORLD = 2


def _ddp_step(comm: Communicator, rank: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    ddp = DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    local = [p.grad for p in reference.parameters()]
    expected = comm.reduce(local, "mean")
    for got, want in zip([p.grad for p in model.parameters()], expected, strict=True):
        if got is None or not torch.allclose(got, want, atol=1e-6):
            shown = None if got is None else got.tolist()
            raise AssertionError(f"DDP gradient {shown} != mean of ranks {want.tolist()}")
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = comm.gather(flat.unsqueeze(0))
    if not all(torch.equal(everyone[0], row) for row in everyone):
        raise AssertionError("parameters differ across ranks after one DDP step")


def worker() -> None:
    """The check each launched process runs."""
    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device)
    try:
        comm = Communicator(ctx)
        world, rank = ctx.world_size, ctx.rank
        if world != _WORLD:
            raise AssertionError(f"expected {_WORLD} processes, this one sees world size {world}")
        total = comm.reduce(torch.tensor([rank + 1.0]), "sum").item()
        if total != world * (world + 1) / 2:
            raise AssertionError(f"all-reduce sum gave {total}, expected {world * (world + 1) / 2}")
        rows = comm.gather(torch.full((rank + 1, 2), float(rank)))
        if rows.shape[0] != world * (world + 1) // 2:
            raise AssertionError(f"uneven gather returned {rows.shape[0]} rows")
        token = comm.broadcast_object_list([f"from rank {rank}"])[0]
        if token != "from rank 0":
            raise AssertionError(f"broadcast delivered {token!r}, expected 'from rank 0'")
        _ddp_step(comm, rank)
        comm.barrier()
        print(f"accel test: rank {rank}: ok", flush=True)
    finally:
        group.close()


if __name__ == "__main__":
    worker()
