"""``accel.utils`` collectives in real processes: one communicator per process group, reused
across calls so that a repeated gather takes the fast path, and ``state.debug`` reaching them
without touching the environment (issue 27)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.spawn import run_workers


def _worker(rank: int) -> dict[str, Any]:
    import os

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from accel import PartialState, utils
    from accel.compat.operations import COMMUNICATORS

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    state = PartialState(cpu=True)
    comm = COMMUNICATORS.current()
    out: dict[str, Any] = {"shared": state._process.comm is comm}
    preds = torch.arange(16) + rank
    first = utils.gather(preds)
    utils.gather(preds)  # builds the plan; the next call reuses it
    with CountOps() as counted:
        third = utils.gather(preds)
    ops = counted.ops
    out["same_comm"] = COMMUNICATORS.current() is comm
    out["plans"] = len(comm._plans)
    out["collectives"] = sum(n for op, n in ops.items() if op.startswith("c10d."))
    out["allocations"] = sorted(op for op in ops if op.startswith(("aten.empty", "aten.zeros",
                                                                   "aten.cat", "aten.new_")))
    out["values"] = first.tolist() == third.tolist() == [q + i for q in range(2)
                                                         for i in range(16)]
    environment = dict(os.environ)
    PartialState(cpu=True).debug = True  # another view: the job's communicator is shared
    out["debug_everywhere"] = state.debug and bool(comm.hooks)
    try:
        utils.gather(torch.ones(2, dtype=torch.float32 if rank == 0 else torch.int64))
        out["mismatch"] = "not caught"
    except utils.DistributedOperationException as exc:
        out["mismatch"] = "rank 1:" in str(exc)
    state.debug = False
    out["env_untouched"] = dict(os.environ) == environment
    out["after"] = utils.gather(torch.tensor([rank])).tolist()
    state.destroy_process_group()
    return out


def test_accel_utils_collectives_reuse_the_groups_communicator() -> None:
    for rank, out in enumerate(run_workers(_worker, 2, timeout=120)):
        assert out["shared"] and out["same_comm"], (rank, out)
        assert out["plans"] >= 1 and out["values"], (rank, out)
        # the steady state: one collective and no allocation but the result's
        assert out["collectives"] == 1 and out["allocations"] == [], (rank, out)
        assert out["debug_everywhere"] and out["mismatch"] is True, (rank, out)
        assert out["env_untouched"] and out["after"] == [0, 1], (rank, out)
