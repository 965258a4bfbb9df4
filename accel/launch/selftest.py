"""``accel test``: start 2 CPU processes through ``accel launch`` and check that they cooperate.

The workers (this module run as ``__main__``) check an all-reduce, an uneven gather, a broadcast
and one DDP training step over gloo (gradients averaged across ranks, parameters identical
afterwards). ``accel test`` prints ``OK`` or what failed.

Example::

    $ accel test
    accel test: OK (2 CPU processes over gloo: reduce, gather, broadcast, DDP step)
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["run_selftest", "worker"]

_WORLD = 2
_TIMEOUT = 180


def _ddp_step(comm: object, rank: int) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel

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
    expected = comm.reduce(local, "mean")  # type: ignore[attr-defined]
    for got, want in zip([p.grad for p in model.parameters()], expected, strict=True):
        if got is None or not torch.allclose(got, want, atol=1e-6):
            shown = None if got is None else got.tolist()
            raise AssertionError(f"DDP gradient {shown} != mean of ranks {want.tolist()}")
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = comm.gather(flat.unsqueeze(0))  # type: ignore[attr-defined]
    if not all(torch.equal(everyone[0], row) for row in everyone):
        raise AssertionError("parameters differ across ranks after one DDP step")


def worker() -> None:
    """The check each launched process runs."""
    import torch

    from ..device import select_device
    from ..distributed import Communicator, build_context, start_process_group
    from ..env import detect_launch

    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info, device)
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


def run_selftest() -> int:
    """Run ``accel launch --cpu -n 2`` on this module; print OK or the failure. Returns 0/1."""
    cmd = [sys.executable, "-m", "accel", "launch", "--cpu", "-n", str(_WORLD), "--quiet",
           "-m", "accel.launch.selftest"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        print(f"accel test: FAILED: the {_WORLD} processes did not finish in {_TIMEOUT} s "
              "(a hang in the rendezvous or a collective)")
        return 1
    oks = [f"rank {rank}: ok" in done.stdout for rank in range(_WORLD)]
    if done.returncode == 0 and all(oks):
        print(f"accel test: OK ({_WORLD} CPU processes over gloo: reduce, gather, broadcast, "
              "DDP step)")
        return 0
    print(f"accel test: FAILED (exit code {done.returncode}); output of `{' '.join(cmd)}`:")
    print(done.stdout + done.stderr)
    return 1


if __name__ == "__main__":
    worker()
