"""Training step: ``hvd.DistributedOptimizer`` (accel.horovod) vs plain PyTorch DDP.

Two processes on CPU over gloo run the same loop (forward, MSE loss, backward, optimizer step,
zero_grad) on their own copies of the same MLP and the same batches: once with the model in
``DistributedDataParallel`` and a plain SGD, once with the bare model and
``hvd.DistributedOptimizer(SGD)`` (gradients reduced in buckets from hooks during backward).
Blocks of steps alternate between the contenders, rotating which goes first, so load and drift
hit them alike. "DDP again" is a second, identical DDP loop: its ratio to the first is the
noise floor of the run (an A/A control). Tables give rank 0's min / median / max wall time and
CPU time (all threads: the overhead, even on a busy machine) per step, and ratios to DDP.

Run:  python benchmarks/bench_horovod.py [--repeats 10] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["main"]

TARGET = 1.10  # hvd / DDP, median step time
AA = "DDP again"
HVD = "hvd.DistributedOptimizer"


@dataclass(frozen=True)
class Case:
    name: str
    width: int
    depth: int
    batch: int  # per rank
    steps: int  # steps per timed block


CASES: tuple[Case, ...] = (Case("small MLP (0.3M params)", 256, 4, 64, 10),
                           Case("medium MLP (8.4M params)", 1024, 8, 64, 3))


def _model(case: Case) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(case.depth):
        layers += [nn.Linear(case.width, case.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(case.width, 1))


def _batches(case: Case, rank: int) -> list[tuple[Any, Any]]:
    import torch

    generator = torch.Generator().manual_seed(1 + rank)
    out = []
    for _ in range(8):
        x = torch.randn(case.batch, case.width, generator=generator)
        out.append((x, x.sum(dim=1, keepdim=True)))
    return out


def _loop(model: Any, optimizer: Any, batches: list[tuple[Any, Any]],
          steps: int) -> Callable[[], None]:
    import torch.nn.functional as F

    state = {"i": 0}

    def block() -> None:
        for _ in range(steps):
            x, y = batches[state["i"] % len(batches)]
            state["i"] += 1
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()

    return block


def _ddp_variant(case: Case, rank: int) -> Callable[[], None]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model(case))
    return _loop(model, torch.optim.SGD(model.parameters(), lr=1e-4), _batches(case, rank),
                 case.steps)


def _hvd_variant(case: Case, rank: int) -> Callable[[], None]:
    import torch

    import accel.horovod as hvd

    model = _model(case)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                         named_parameters=model.named_parameters())
    return _loop(model, optimizer, _batches(case, rank), case.steps)


Times = dict[str, dict[str, dict[str, list[float]]]]  # clock -> case -> contender -> seconds


def _worker(rank: int, cases: tuple[Case, ...], repeats: int, warmup: int) -> Times:
    import torch

    import accel.horovod as hvd

    torch.set_num_threads(1)
    hvd.init()  # starts the gloo group both contenders use
    out: Times = {"wall": {}, "cpu": {}}
    for case in cases:
        variants = {"DDP": _ddp_variant(case, rank), AA: _ddp_variant(case, rank),
                    HVD: _hvd_variant(case, rank)}
        timed = _common.interleave(variants, repeats=repeats, warmup=warmup)
        for clock, times in zip(("wall", "cpu"), timed, strict=True):
            out[clock][case.name] = {name: [t / case.steps for t in values]
                                     for name, values in times.items()}
    hvd.shutdown()
    return out


def _table(title: str, results: dict[str, dict[str, list[float]]]) -> str:
    columns = ["DDP", AA, HVD]
    rows: list[list[Any]] = []
    for name, times in results.items():
        for stat, fn in (("min", min), ("median", _common.median), ("max", max)):
            rows.append([f"{name} {stat}"] + [float(fn(times[c])) for c in columns])
    return _common.format_table(title, ["model / statistic"] + columns, rows,
                                ratio_of=[AA, HVD])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=10)
    args = parser.parse_args(argv)
    cases, repeats, warmup = CASES, max(args.repeats, 5), 2
    if args.quick:
        cases = tuple(Case(c.name, 32, 2, 4, 2) for c in CASES)
        repeats, warmup = 2, 1
    results = _common.run_workers(_worker, 2, (cases, repeats, warmup))[0]
    what = f"2 processes (gloo), rank 0, {repeats} interleaved blocks"
    print(_table(f"Wall time per training step, {what}", results["wall"]))
    print()
    print(_table(f"CPU time per training step (all threads of rank 0), {what}", results["cpu"]))
    print(_common.machine_line())
    for clock in ("wall", "cpu"):
        for name, times in results[clock].items():
            value = _common.ratio(_common.median(times[HVD]), _common.median(times["DDP"]))
            control = _common.ratio(_common.median(times[AA]), _common.median(times["DDP"]))
            print(f"target ({clock}): hvd / DDP <= {TARGET:.2f}, {name}: {value:.3f} "
                  f"({'met' if value <= TARGET else 'MISSED'}; DDP against itself: "
                  f"{control:.3f})")
            _common.record("bench_horovod", f"hvd.DistributedOptimizer step, {name} ({clock})",
                           accel=times[HVD], baseline=times["DDP"], baseline_name="DDP",
                           target=TARGET, note=f"DDP against itself {control:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
