"""Asynchronous checkpoints: how long a training loop is blocked per ``save_state``.

One process trains an MLP (``--mb`` MB of parameters, AdamW: the checkpoint holds ~3x that)
and calls ``accelerator.save_state()`` every ``--every`` steps, ``--saves`` times per loop run.
Three loops alternate in one run (rotating which goes first, ``--repeats`` times):

- ``blocking``: ``save_state()``: the loop waits until the checkpoint is durable;
- ``non-blocking``: ``save_state(blocking=False)``: the loop waits for the host copy (and for
  the previous save, if it is still being written when the next one starts);
- ``no saves``: the same loop without checkpoints, the floor for the total wall.

Printed: the time the loop is blocked per save (min/median/max over every save of every run)
and the total wall of one loop run, each with its ratio to the blocking loop. The background
writer shares the CPU with training, so on a machine with few cores the total wall gains less
than the blocked time; figures on a busy machine move between runs (the load average is
printed beside them).

Run:  python benchmarks/bench_async_checkpoint.py [--mb 40] [--every 10] [--saves 4]
      [--repeats 5] [--dir /tmp] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

from accel import Accelerator

__all__ = ["main"]

MODES = ("blocking", "non-blocking", "no saves")


def _setup(megabytes: int, work: Path) -> tuple[Accelerator, Any, Any]:
    width = 1024
    layers = max(1, round(megabytes * 1e6 / (4 * (width * width + width))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    acc = Accelerator(cpu=True, project_dir=str(work))
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _loop(acc: Accelerator, model: Any, opt: Any, mode: str, every: int, saves: int,
          blocked: list[float], waited: list[float]) -> float:
    """One training run; appends the seconds each save blocked it (and, of those, the wait
    for the previous save still in flight); returns its wall time (the final wait for a save
    in flight included: the run is over when its checkpoint is)."""
    batch = torch.randn(4, 1024)
    start = time.perf_counter()
    for step in range(1, every * saves + 1):
        loss = model(batch).pow(2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if mode != "no saves" and step % every == 0:
            began = time.perf_counter()
            acc.wait_for_checkpoint()  # what save_state() does first anyway: timed apart
            waited.append(time.perf_counter() - began)
            acc.save_state(total_limit=2, blocking=mode == "blocking")
            blocked.append(time.perf_counter() - began)
    began = time.perf_counter()
    acc.wait_for_checkpoint()
    if mode == "non-blocking":  # the last save's tail also keeps the run from being done
        blocked[-1] += time.perf_counter() - began
        waited[-1] += time.perf_counter() - began
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=40, help="parameters in MB (AdamW adds 2x)")
    parser.add_argument("--every", type=int, default=10, help="steps between two saves")
    parser.add_argument("--saves", type=int, default=4, help="saves per loop run")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    _common.add_common_args(parser, repeats=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.mb, args.every, args.saves, args.repeats = 4, 2, 2, 2
    work = Path(tempfile.mkdtemp(prefix="bench-async-ckpt-", dir=args.dir))
    load_before = os.getloadavg()[0]
    try:
        acc, model, opt = _setup(args.mb, work)
        blocked: dict[str, list[float]] = {mode: [] for mode in MODES}
        waited: dict[str, list[float]] = {mode: [] for mode in MODES}
        variants = {mode: (lambda m=mode: _loop(acc, model, opt, m, args.every, args.saves,
                                                blocked[m], waited[m]))
                    for mode in MODES}
        _loop(acc, model, opt, "non-blocking", args.every, 1, [], [])  # warm-up
        _loop(acc, model, opt, "blocking", args.every, 1, [], [])
        wall, cpu = _common.interleave(variants, repeats=args.repeats)
        acc.end_training()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    state_mb = 3 * args.mb
    print(f"Asynchronous save_state: ~{state_mb} MB checkpoint (model + AdamW), a save every "
          f"{args.every} steps, {args.saves} saves per run, {args.repeats} alternations")
    print(_common.machine_line() + f" (load average before: {load_before:.1f})")
    waits = waited["non-blocking"]
    print(f"non-blocking: of the time blocked per save, waiting for the previous save still "
          f"in flight: median {_common.format_seconds(_common.median(waits))}, max "
          f"{_common.format_seconds(max(waits))} (more steps between saves hide it)")
    rows = []
    for figure, samples in (("blocked per save", blocked), ("loop wall", wall)):
        for mode in MODES:
            values = samples[mode]
            if not values:
                continue
            versus = _common.ratio(_common.median(values), _common.median(samples["blocking"]))
            rows.append([f"{figure}: {mode}", _common.median(values), min(values), max(values),
                         f"{versus:.2f}"])
    print(_common.format_table("Time the training loop is blocked per save, and loop wall",
                               ["case", "median", "min", "max", "/ blocking"], rows))
    blocked_rec = _common.record(
        "bench_async_checkpoint", "training loop blocked per save_state",
        accel=blocked["non-blocking"], baseline=blocked["blocking"],
        baseline_name="blocking save_state", target=0.5,
        note=f"{state_mb} MB checkpoint, save_state(blocking=False) vs blocking")
    wall_rec = _common.record(
        "bench_async_checkpoint", "training loop wall with periodic saves",
        accel=wall["non-blocking"], baseline=wall["blocking"],
        baseline_name="blocking save_state", target=1.0,
        note=f"{args.every * args.saves} steps, {args.saves} saves; no saves: "
             f"{_common.median(wall['no saves']):.3f} s")
    print(f"target: non-blocking / blocking <= 0.50 for the time blocked per save: "
          f"{blocked_rec['ratio']:.2f} ({'met' if blocked_rec['met'] else 'NOT met'})")
    print(f"target: non-blocking / blocking <= 1.00 for the loop wall: "
          f"{wall_rec['ratio']:.2f} ({'met' if wall_rec['met'] else 'NOT met'}); "
          f"CPU s per run (median): " + ", ".join(
              f"{m} {_common.median(cpu[m]):.2f}" for m in MODES))


if __name__ == "__main__":
    main()
