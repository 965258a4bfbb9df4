"""Parameter-server throughput (accel.ps): rows pulled and pushed per second, and training
samples per second in ``sync`` vs ``async`` mode.

Each figure is measured in a real job, ``accel launch --cpu --server_num 1 --worker_num 2``
(servers and workers over torch.distributed.rpc / TensorPipe), started once per mode; worker 0
reports. The baseline, measured in this process in the same run, is plain PyTorch with the
whole table in one process (``nn.Embedding(sparse=True)`` + sparse ``torch.optim.Adagrad``):
what the parameter server costs against a table that fits in one process. Rows/s count
distinct rows (what travels); samples/s are over all workers.

Run:  python benchmarks/bench_ps.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["main"]

ROWS, DIM, FIELDS, BATCH = 200_000, 16, 26, 512
WORKERS = 2


def _ids(step: int) -> Any:
    import torch

    gen = torch.Generator().manual_seed(step)
    return (torch.rand(BATCH, FIELDS, generator=gen) ** 2 * ROWS).long()


def _model(table: Any) -> Any:
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = table
            self.mlp = nn.Sequential(nn.Linear(FIELDS * DIM, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, ids: Any) -> Any:
            return self.mlp(self.table(ids).flatten(1)).squeeze(1)

    return Net()


def _train(model: Any, opt: Any, steps: int, backward: Any, extra: Any = None) -> float:
    """Samples per second of ``steps`` training steps of this process."""
    import torch

    loss_fn = torch.nn.BCEWithLogitsLoss()
    start = time.perf_counter()
    for step in range(steps):
        ids = _ids(step)
        backward(loss_fn(model(ids), (ids[:, 0] % 2).float()))
        for o in (opt, extra):
            if o is not None:
                o.step()
                o.zero_grad()
    return steps * BATCH / (time.perf_counter() - start)


def _rows_per_second(table: Any, repeats: int) -> tuple[float, float]:
    """(distinct rows pulled per s, distinct rows pushed per s) of one worker."""
    import torch

    pulled = pushed = 0
    pull_s = push_s = 0.0
    for step in range(repeats):
        ids = _ids(10_000 + step)
        rows = int(torch.unique(ids).numel())
        start = time.perf_counter()
        out = table(ids)
        pull_s += time.perf_counter() - start
        start = time.perf_counter()
        out.sum().backward()
        table.flush()
        push_s += time.perf_counter() - start
        pulled, pushed = pulled + rows, pushed + rows
    return pulled / pull_s, pushed / push_s


def child(mode: str, repeats: int, steps: int) -> None:
    """One server or worker of the measured job."""
    import torch

    from accel import Accelerator, ps

    if ps.is_server():
        ps.run_server()
        return
    acc = Accelerator(cpu=True)
    table = ps.ShardedEmbedding(ROWS, DIM, ps.Adagrad(lr=0.05), mode=mode, name="bench")
    torch.manual_seed(0)
    net = _model(table)
    model, opt = acc.prepare(net, torch.optim.Adam(net.mlp.parameters(), lr=1e-3))
    _train(model, opt, 2, acc.backward)  # warm-up
    pull, push = _rows_per_second(table, repeats)
    rates = [_train(model, opt, steps, acc.backward) for _ in range(repeats)]
    table.flush()
    if acc.is_main_process:
        report = {"mode": mode, "pull": pull, "push": push, "samples": [r * WORKERS
                                                                        for r in rates]}
        print("RESULT " + json.dumps(report), flush=True)
    ps.stop_worker()


def _baseline(repeats: int, steps: int) -> list[float]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = _model(nn.Embedding(ROWS, DIM, sparse=True))
    dense = torch.optim.Adam(net.mlp.parameters(), lr=1e-3)
    sparse = torch.optim.Adagrad(net.table.parameters(), lr=0.05)
    _train(net, dense, 2, lambda loss: loss.backward(), sparse)
    return [_train(net, dense, steps, lambda loss: loss.backward(), sparse)
            for _ in range(repeats)]


def _job(mode: str, repeats: int, steps: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "accel", "launch", "--cpu", "-q", "--server_num", "1",
            "--worker_num", str(WORKERS), __file__, "--child", mode, "--repeats", str(repeats),
            "--steps", str(steps)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    match = re.search(r"RESULT (\{.*\})", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stdout}\n"
                           f"{done.stderr}")
    result: dict[str, Any] = json.loads(match.group(1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(parser, repeats=5)
    parser.add_argument("--child", choices=["sync", "async"], help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20, help="training steps per repeat")
    args = parser.parse_args()
    repeats, steps = (2, 3) if args.quick else (args.repeats, args.steps)
    if args.child:
        child(args.child, repeats, steps)
        return
    print(_common.machine_line())
    print(f"table {ROWS} x {DIM}, batch {BATCH} x {FIELDS} ids per worker, 1 server + "
          f"{WORKERS} workers on CPU")
    base = _baseline(repeats, steps)
    jobs = {mode: _job(mode, repeats, steps) for mode in ("sync", "async")}
    rows = [["torch, whole table in 1 process", "-", "-", _common.median(base)]]
    for mode, job in jobs.items():
        rows.append([f"accel.ps {mode}", job["pull"], job["push"],
                     _common.median(job["samples"])])
        _common.record("bench_ps", f"samples/s {mode}, 1 server + {WORKERS} workers",
                       accel=job["samples"], baseline=base, baseline_name="torch 1 process",
                       unit="samples/s", higher_is_better=True,
                       note=f"rows/s pulled {job['pull']:.0f}, pushed {job['push']:.0f}")
    print(f"{'':34} {'rows/s pulled':>14} {'rows/s pushed':>14} {'samples/s':>10}")
    for name, pull, push, samples in rows:
        cells = [f"{v:>14,.0f}" if isinstance(v, float) else f"{v:>14}" for v in (pull, push)]
        print(f"{name:34} {cells[0]} {cells[1]} {samples:>10,.0f}")
    sync, asyn = (_common.median(jobs[m]["samples"]) for m in ("sync", "async"))
    print(f"async / sync samples/s: {_common.ratio(asyn, sync):.2f}")


if __name__ == "__main__":
    main()
