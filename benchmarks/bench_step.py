"""Training-step overhead: plain PyTorch DDP vs accel (vs Hugging Face accelerate if installed).

Two processes on CPU over gloo run the same loop (next batch, forward, MSE loss, backward,
optimizer step, zero_grad) written three ways, each with its own copy of the same model and
data: plain ``DistributedDataParallel`` + ``DistributedSampler``; accel (``Accelerator``,
``prepare``, ``accelerator.backward``); and accelerate when it is importable. The variants run
in blocks of steps, interleaved (rotating which goes first) in the same processes, so load and
drift hit them alike. The tables show rank 0's median wall time and CPU time per step and
the ratio to plain PyTorch (CPU time isolates framework overhead when the machine is busy).
The "+ accumulate()" row wraps the accel/accelerate steps in ``accelerator.accumulate(model)``
(gradient_accumulation_steps=1), as many scripts do. "torch again" is a second, identical
plain-PyTorch loop: its ratio to the first is the noise floor of the run (an A/A control).
Min / median / max per step follow the tables; every case's wall time (and the tiny model's CPU
time) is also recorded for run_all.sh's results file (``_common.record``).

Run:  python benchmarks/bench_step.py [--repeats 30] [--quick] [--no-accelerate]
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

TARGET = 1.05  # accel / torch on the tiny model
#: the plain-PyTorch loop measured a second time: its ratio to the first shows the noise
AA = "torch again"


@dataclass(frozen=True)
class Case:
    name: str
    width: int  # input features and hidden width
    depth: int  # hidden layers
    batch: int  # per rank
    steps: int  # steps per timed block
    accumulate: bool = False


CASES: tuple[Case, ...] = (Case("tiny", 16, 1, 32, 50),
                           Case("tiny + accumulate()", 16, 1, 32, 50, True),
                           Case("medium", 512, 4, 64, 4))


def _model(case: Case) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(case.depth):
        layers += [nn.Linear(case.width, case.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(case.width, 1))


def _dataset(case: Case, world: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(1)
    n = case.batch * world * 64
    x = torch.randn(n, case.width, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def _torch_variant(case: Case, rank: int, world: int) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    model = DistributedDataParallel(_model(case))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dataset = _dataset(case, world)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world,
                                                          rank=rank, shuffle=True, seed=0)
    loop = _common.Loop(DataLoader(dataset, batch_size=case.batch, sampler=sampler),
                        sampler.set_epoch)

    def block() -> None:
        for _ in range(case.steps):
            x, y = loop.batch()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    return block


def _framework_variant(accelerator: Any, case: Case, world: int) -> Callable[[], None]:
    """The same loop through accel's or accelerate's Accelerator (identical public API)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    model = _model(case)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(_dataset(case, world), batch_size=case.batch, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loop = _common.Loop(loader)

    def step() -> None:
        x, y = loop.batch()
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    def block() -> None:
        for _ in range(case.steps):
            if case.accumulate:
                with accelerator.accumulate(model):
                    step()
            else:
                step()

    return block


def _worker(rank: int, cases: tuple[Case, ...], repeats: int, warmup: int,
            use_accelerate: bool) -> dict[str, dict[str, dict[str, list[float]]]]:
    import torch

    torch.set_num_threads(1)
    accel_acc, other = _common.accelerators(use_accelerate)
    world = accel_acc.num_processes
    out: dict[str, dict[str, dict[str, list[float]]]] = {"wall": {}, "cpu": {}}
    for case in cases:
        variants = {"torch": _torch_variant(case, rank, world),
                    AA: _torch_variant(case, rank, world),
                    "accel": _framework_variant(accel_acc, case, world)}
        if other is not None:
            variants["accelerate"] = _framework_variant(other, case, world)
        for clock, times in zip(("wall", "cpu"),
                                _common.interleave(variants, repeats=repeats, warmup=warmup),
                                strict=True):
            out[clock][case.name] = {name: [t / case.steps for t in values]
                                     for name, values in times.items()}
    return out


def _table(title: str, results: dict[str, dict[str, list[float]]], columns: list[str]) -> str:
    rows = [[name] + [_common.median(times[c]) for c in columns]
            for name, times in results.items()]
    return _common.format_table(title, ["model"] + columns, rows, ratio_of=columns[1:])


def _record(results: dict[str, dict[str, dict[str, list[float]]]],
            cases: tuple[Case, ...]) -> None:
    """Every case's wall time, and the tiny model's CPU time, for run_all.sh's results."""
    for clock in ("wall", "cpu"):
        for case in cases if clock == "wall" else cases[:1]:
            times = results[clock][case.name]
            control = _common.ratio(_common.median(times[AA]), _common.median(times["torch"]))
            _common.record("bench_step", f"training step, {case.name} ({clock})",
                           accel=times["accel"], baseline=times["torch"], baseline_name="DDP",
                           accelerate=times.get("accelerate"),
                           target=TARGET if case is cases[0] else None,
                           note=f"DDP against itself {control:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=30)
    args = parser.parse_args(argv)
    cases = CASES
    repeats, warmup = args.repeats, 3
    if args.quick:
        cases = tuple(Case(c.name, c.width, c.depth, 4, 2, c.accumulate) for c in CASES)
        repeats, warmup = 2, 1
    use_accelerate = _common.has_accelerate() and not args.no_accelerate
    results = _common.run_workers(_worker, 2, (cases, repeats, warmup, use_accelerate))[0]
    columns = ["torch", AA, "accel"] + (["accelerate"] if use_accelerate else [])
    what = f"2 processes (gloo), rank 0, median of {repeats} interleaved blocks"
    print(_table(f"Wall time per training step, {what}", results["wall"], columns))
    print()
    print(_table(f"CPU time per training step (all threads of rank 0), {what}",
                 results["cpu"], columns))
    print(_common.spread_lines("per step (wall)", results["wall"], columns))
    print(_common.machine_line())
    for clock in ("wall", "cpu"):
        tiny = results[clock][cases[0].name]
        value = _common.ratio(_common.median(tiny["accel"]), _common.median(tiny["torch"]))
        control = _common.ratio(_common.median(tiny[AA]), _common.median(tiny["torch"]))
        print(f"target ({clock}): accel / torch <= {TARGET} on the tiny model: "
              f"{value:.3f} ({'met' if value <= TARGET else 'MISSED'}; "
              f"torch against itself: {control:.3f})")
    _record(results, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
