"""Communicator.gather's steady state (reused send buffers, one strided copy per leaf) in real
processes over gloo: every rank builds every rank's input, so the expected result is known."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.spawn import run_workers

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool, torch.int8,
          torch.uint8, torch.int16, torch.int32, torch.int64, torch.complex64, torch.complex128)


def _value(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


class _CountOps(TorchDispatchMode):
    """Counts the tensor operations (views included) and collectives run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def _worker(rank: int) -> dict[str, Any]:
    from accel.device import select_device
    from accel.distributed import Communicator, build_context, start_process_group
    from accel.env import detect_launch

    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device)
    comm = Communicator(ctx)
    failures: list[str] = []

    def check(name: str, make: Callable[[int], torch.Tensor]) -> None:
        got = comm.gather(make(rank))
        parts = [make(q).detach() for q in range(ctx.world_size)]
        expected = torch.cat([p.reshape(1) if p.dim() == 0 else p for p in parts])
        if not _same(got, expected):
            failures.append(f"{name}: got {got!r}, expected {expected!r}")

    # every dtype, three calls each (the 2nd and 3rd reuse the send buffer), values change
    for i, dtype in enumerate(DTYPES):
        for call in range(3):
            check(f"{dtype} call {call}",
                  lambda q, d=dtype, s=100 * i + 10 * call: _value(d, (3, 2), s + q))
    # 0-d, empty, non-contiguous, requires_grad, several leaves in one structure
    check("0-d", lambda q: torch.tensor(float(q) + 0.5))
    check("empty", lambda q: torch.zeros(0, 4))
    check("transposed", lambda q: torch.arange(12.0).reshape(3, 4).t() + q)
    check("grad", lambda q: torch.ones(2, 2, requires_grad=True) * (q + 1))
    first = comm.gather({"a": torch.full((2,), rank), "b": [torch.tensor(rank == 0)]})
    kept = first["a"].clone()
    second = comm.gather({"a": torch.full((2,), rank + 10), "b": [torch.tensor(rank == 1)]})
    if not torch.equal(first["a"], kept):
        failures.append("a later gather changed an earlier result")
    if second["a"].tolist() != [q + 10 for q in range(ctx.world_size) for _ in range(2)]:
        failures.append(f"second nested gather: {second['a'].tolist()}")
    if second["b"][0].tolist() != [q == 1 for q in range(ctx.world_size)]:
        failures.append(f"second nested bool gather: {second['b'][0].tolist()}")
    # shapes change, then grow past the capacity, then come back (buffers rebuilt each time)
    for step, n in enumerate((4, 4, 5, 3000, 3000, 4)):
        check(f"resize {step}",
              lambda q, n=n: torch.arange(n * 2, dtype=torch.int64).reshape(n, 2) + q)
    # uneven after uniform with the same key, and more keys than buffers are kept for
    check("uneven", lambda q: torch.ones(q + 1, 2) * q)
    for width in range(1, 12):
        check(f"width {width}", lambda q, w=width: torch.full((2, w), float(q)))
    _steady_state(comm, rank, failures)
    _shapes_change(comm, rank, ctx.world_size, failures)
    group.close()
    return {"failures": failures}


def _steady_state(comm: Any, rank: int, failures: list[str]) -> None:
    """Same shapes again: one collective, one header comparison, one copy in and one out per
    leaf, and no other allocation or view."""
    preds, labels = torch.arange(32) + rank, torch.ones(32, dtype=torch.int64) * rank
    for _ in range(2):  # builds the plan, then reuses it
        comm.gather((preds, labels))
    with _CountOps() as counted:
        out = comm.gather((preds, labels))
    ops = counted.ops
    collectives = sum(n for op, n in ops.items() if op.startswith("c10d."))
    if collectives != 1:
        failures.append(f"steady state: {collectives} collectives per call, expected 1: {ops}")
    # two copies in (one per leaf), one header comparison, two copies out: nothing allocated
    # but the two results (``clone`` inside ``contiguous``)
    allocations = {op: n for op, n in ops.items() if op.startswith(("aten.empty", "aten.new_",
                                                                     "aten.zeros", "aten.cat"))}
    if allocations or ops["aten.clone.default"] != 2 or ops["aten.copy_.default"] != 2:
        failures.append(f"steady state: unexpected tensor operations {dict(ops)}")
    # the header and every leaf's rows are views made once (kept with the receive buffer)
    views = {op: n for op, n in ops.items() if op.startswith(("aten.as_strided", "aten.slice",
                                                              "aten.view"))}
    if views or ops["aten.equal.default"] != 1:
        failures.append(f"steady state: views or header checks made per call: {dict(ops)}")
    if not isinstance(out, tuple) or out[0].tolist() != [q + i for q in range(2)
                                                         for i in range(32)]:
        failures.append(f"steady state result: {out!r}")


def _shapes_change(comm: Any, rank: int, world: int, failures: list[str]) -> None:
    """Shapes that change mid-epoch on some ranks only (shorter, longer, past the capacity,
    back): one collective while every rank sends what it sent last time, two only when a rank
    outgrows the agreed capacity, and every result exact. Earlier results (a 0-d loss, a batch
    of one) must not change when later gathers reuse the receive buffer."""
    sizes = [(8, 8), (8, 8), (8, 5), (8, 8), (3000, 8), (8, 8), (8, 8), (1, 1), (1, 1), (8, 8)]
    kept: list[tuple[torch.Tensor, torch.Tensor, list[float], list[float]]] = []
    for step, per_rank in enumerate(sizes):
        def make(q: int, step: int = step, per_rank: tuple[int, ...] = per_rank) -> Any:
            n = per_rank[q % len(per_rank)]
            return (torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 100 * q + step,
                    torch.tensor(float(step * 10 + q)))
        with _CountOps() as counted:
            got = comm.gather(make(rank))
        expected = [torch.cat([make(q)[0] for q in range(world)]),
                    torch.stack([make(q)[1] for q in range(world)])]
        if not all(_same(g, e) for g, e in zip(got, expected, strict=True)):
            failures.append(f"shapes change, step {step}: got {got!r}")
        collectives = sum(n for op, n in counted.ops.items() if op.startswith("c10d."))
        outgrown = step == 4  # rank 0's 3000 x 3 floats exceed the agreed capacity
        if collectives != (2 if outgrown else 1):
            failures.append(f"shapes change, step {step}: {collectives} collectives")
        kept.append((got[0], got[1], got[0].flatten().tolist(), got[1].tolist()))
    for step, (big, loss, big_values, loss_values) in enumerate(kept):
        if big.flatten().tolist() != big_values or loss.tolist() != loss_values:
            failures.append(f"shapes change: the result of step {step} changed later")


def test_gather_steady_state_matches_all_gather() -> None:
    for rank, result in enumerate(run_workers(_worker, 2)):
        assert result["failures"] == [], f"rank {rank}: {result['failures']}"
