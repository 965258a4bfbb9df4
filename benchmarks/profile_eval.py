"""Where an evaluation loop's time goes: bench_eval.py's loops under cProfile, per rank.

Two processes on CPU over gloo run bench_eval.py's plain-PyTorch and accel loops for a few
epochs each under ``cProfile`` (one profile per rank and loop), then once more under a
``TorchDispatchMode`` that counts the tensor operations (views included) and the collectives
per batch. Printed per batch (rank 0): the time inside each part of the loop (cumulative, so
nested parts are inside their parents) and the op counts. The profiler inflates every Python
call, so the parts are to compare with each other, not wall times.

Run:  python benchmarks/profile_eval.py [--case 0] [--epochs 20] [--top 25]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import bench_eval

__all__ = ["main"]

#: (part, file suffix, function) of the entries whose cumulative time is shown
PARTS = (
    ("loader: next batch (all of it)", "accel/data/loader.py", "_iterate"),
    ("  torch DataLoader __next__", "torch/utils/data/dataloader.py", "__next__"),
    ("  send_to_device", "accel/data/transfer.py", "send_to_device"),
    ("  tracking (_take)", "accel/data/loader.py", "_take"),
    ("model forward", "torch/nn/modules/module.py", "_call_impl"),
    ("gather_for_metrics (all of it)", "accel/data/metrics.py", "gather_for_metrics"),
    ("  trim_for_metrics", "accel/data/loader.py", "trim_for_metrics"),
    ("  flatten", "accel/_tree.py", "flatten"),
    ("  Communicator.gather_flat", "accel/distributed/ops.py", "gather_flat"),
    ("    collective hooks (enter)", "accel/distributed/ops.py", "_collective"),
    ("    hook: CollectiveMonitor.__call__", "accel/distributed/stall.py", "__call__"),
    ("    _gather_leaves", "accel/distributed/ops.py", "_gather_leaves"),
    ("      pack (_send_buffer, before)", "accel/distributed/ops.py", "_send_buffer"),
    ("      plan lookup (_send_plan)", "accel/distributed/ops.py", "_send_plan"),
    ("      pack (_SendPlan.fill)", "accel/distributed/ops.py", "fill"),
    ("      collective (_all_gather)", "accel/distributed/ops.py", "_all_gather"),
    ("      collective (_SendPlan.receive)", "accel/distributed/ops.py", "receive"),
    ("      header check (_SendPlan.uniform)", "accel/distributed/ops.py", "uniform"),
    ("      unpack (_unpack_uniform)", "accel/distributed/ops.py", "_unpack_uniform"),
    ("      unpack (_SendPlan.results)", "accel/distributed/ops.py", "results"),
    ("      unpack (_unpack, uneven)", "accel/distributed/ops.py", "_unpack"),
    ("    rebuild", "accel/_tree.py", "rebuild"),
    ("torch: dist.all_gather", "torch/distributed/distributed_c10d.py", "all_gather"),
)


def _parts(stats: Any, batches: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, suffix, name in PARTS:
        total = sum(value[3] for key, value in stats.stats.items()
                    if key[2] == name and key[0].replace("\\", "/").endswith(suffix))
        if total:
            out[label] = total / batches
    return out


def _count_ops(epoch: Any) -> Counter[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        epoch()
    return counter.ops


def _worker(rank: int, case: bench_eval.Case, epochs: int, top: int) -> dict[str, Any]:
    import cProfile
    import io
    import pstats

    import torch

    torch.set_num_threads(1)
    from accel import Accelerator

    accelerator = Accelerator(cpu=True)
    world = accelerator.num_processes
    loops = {"torch": bench_eval._torch_variant(case, rank, world),
             "accel": bench_eval._framework_variant(accelerator, case, world)}
    batches = -(-bench_eval._length(case, world) // (case.batch * world))
    out: dict[str, Any] = {}
    for name, epoch in loops.items():
        epoch()  # warm-up: first calls, buffers
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(epochs):
            epoch()
        profile.disable()
        stats = pstats.Stats(profile)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
        ops = _count_ops(epoch)
        out[name] = {"parts": _parts(stats, batches * epochs), "top": text.getvalue(),
                     "ops": {k: v / batches for k, v in ops.most_common()}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", type=int, default=0,
                        help=f"index into bench_eval.CASES (0..{len(bench_eval.CASES) - 1})")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="functions listed by own time")
    parser.add_argument("--rank", type=int, default=0, help="whose profile is printed")
    args = parser.parse_args(argv)
    case = bench_eval.CASES[args.case]
    results = _common.run_workers(_worker, 2, (case, args.epochs, args.top))[args.rank]
    print(f"{case.name}: rank {args.rank}, {args.epochs} epochs under cProfile; "
          f"{_common.machine_line()}")
    for name, result in results.items():
        print(f"\n== {name}: cumulative time per batch (under the profiler)")
        for label, seconds in result["parts"].items():
            print(f"  {label:<40} {_common.format_seconds(seconds):>10}")
        total = sum(result["ops"].values())
        print(f"  tensor ops per batch: {total:.1f} (collectives: "
              f"{sum(v for k, v in result['ops'].items() if k.startswith('c10d.')):.1f})")
        for op, count in result["ops"].items():
            print(f"    {op:<45} {count:.2f}")
    for name, result in results.items():
        print(f"\n== {name}: functions by own time\n{result['top']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
