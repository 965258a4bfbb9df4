"""``gather_for_metrics`` per batch vs one raw ``dist.all_gather`` of the same tensor.

Two processes on CPU over gloo iterate a prepared loader (so ``gather_for_metrics`` does its
real work: find the active loader, trim the padded last batch, gather with uneven first
dimensions). At every batch each rank gathers the same tensor twice, in alternating order:
once with ``accelerator.gather_for_metrics`` and once the way plain PyTorch code does it
(``dist.all_gather`` into a list of ``empty_like`` buffers, then ``torch.cat``). With Hugging
Face accelerate installed, its ``gather_for_metrics`` over its own prepared loader is a third
column. Medians of per-call wall and CPU time on rank 0, and ratios to the raw gather.
"torch again" times the raw gather a second time: its ratio to the first is the noise floor.

Run:  python benchmarks/bench_gather.py [--repeats 400] [--quick] [--no-accelerate]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["main"]

TARGET = 1.2  # gather_for_metrics / raw all_gather
#: the raw gather timed a second time: its ratio to the first shows the noise
AA = "torch again"


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]  # per rank and batch; shape[0] is the batch size
    dtype: str


CASES = (Case("labels (32,) int64", (32,), "int64"),
         Case("logits (32, 10) float32", (32, 10), "float32"),
         Case("logits (256, 1000) float32", (256, 1000), "float32"))


def _raw(tensor: Any, world: int) -> Callable[[], Any]:
    import torch
    import torch.distributed as dist

    def gather() -> Any:
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts)

    return gather


def _loader(case: Case, world: int, batches: int) -> Any:
    import torch

    # Not a multiple of world x batch: the last batch is padded, and trimmed by the gather.
    n = case.shape[0] * world * batches - 3
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(n)),
                                       batch_size=case.shape[0])


def _time(fn: Callable[[], Any], wall: list[float], cpu: list[float]) -> None:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    wall.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)


def _run_case(case: Case, accelerators: dict[str, Any], world: int, repeats: int
              ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    import torch

    tensor = (torch.randn(case.shape) if case.dtype == "float32"
              else torch.randint(0, 1000, case.shape))
    loaders = {name: acc.prepare(_loader(case, world, repeats + 2))
               for name, acc in accelerators.items()}
    names = ["torch", AA, *accelerators]
    calls: dict[str, Callable[[], Any]] = {"torch": _raw(tensor, world), AA: _raw(tensor, world)}
    for name, acc in accelerators.items():
        calls[name] = (lambda a: lambda: a.gather_for_metrics(tensor))(acc)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for index, _batches in enumerate(zip(*loaders.values(), strict=False)):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            _time(calls[name], wall[name], cpu[name])
    for times in (wall, cpu):  # drop the warm-up batches (capacity growth, first calls)
        for name in names:
            del times[name][:2]
    return wall, cpu


def _worker(rank: int, cases: tuple[Case, ...], repeats: int, use_accelerate: bool
            ) -> dict[str, dict[str, dict[str, list[float]]]]:
    import torch

    torch.set_num_threads(1)
    from accel import Accelerator

    accelerators: dict[str, Any] = {"accel": Accelerator(cpu=True)}
    world = accelerators["accel"].num_processes
    if use_accelerate:
        import accelerate

        accelerators["accelerate"] = accelerate.Accelerator(cpu=True)
    out: dict[str, dict[str, dict[str, list[float]]]] = {"wall": {}, "cpu": {}}
    for case in cases:
        out["wall"][case.name], out["cpu"][case.name] = _run_case(case, accelerators, world,
                                                                  repeats)
    return out


def _table(title: str, results: dict[str, dict[str, list[float]]], columns: list[str]) -> str:
    rows = [[name] + [_common.median(times[c]) for c in columns]
            for name, times in results.items()]
    return _common.format_table(title, ["tensor per rank"] + columns, rows,
                                ratio_of=columns[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_common_args(parser, repeats=400)
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else args.repeats
    use_accelerate = _common.has_accelerate() and not args.no_accelerate
    results = _common.run_workers(_worker, 2, (CASES, repeats, use_accelerate))[0]
    columns = ["torch", AA, "accel"] + (["accelerate"] if use_accelerate else [])
    what = f"2 processes (gloo), rank 0, median of {repeats} batches"
    print(_table(f"Wall time per gather (torch = all_gather + cat), {what}", results["wall"],
                 columns))
    print()
    print(_table(f"CPU time per gather (all threads of rank 0), {what}", results["cpu"],
                 columns))
    print(_common.machine_line())
    for clock in ("wall", "cpu"):
        for case, times in results[clock].items():
            aa = _common.ratio(_common.median(times[AA]), _common.median(times["torch"]))
            _common.record("bench_gather", f"gather_for_metrics per batch, {case} ({clock})",
                           accel=times["accel"], baseline=times["torch"],
                           accelerate=times.get("accelerate"), target=TARGET,
                           note=f"raw all_gather + cat; torch against itself {aa:.2f}")
    for clock in ("wall", "cpu"):
        worst = max(_common.ratio(_common.median(t["accel"]), _common.median(t["torch"]))
                    for t in results[clock].values())
        spread = max(abs(_common.ratio(_common.median(t[AA]), _common.median(t["torch"])) - 1)
                     for t in results[clock].values())
        print(f"target ({clock}): gather_for_metrics / all_gather <= {TARGET} on every row: "
              f"worst {worst:.3f} ({'met' if worst <= TARGET else 'MISSED'}; "
              f"torch against itself within {spread:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
