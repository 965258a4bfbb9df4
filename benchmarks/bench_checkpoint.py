"""Checkpoint save/load: accel against torch.save / torch.load(weights_only=True) and Accelerate.

The same state, a model of ``--mb`` MB (default 136 MB: ~34M float32 parameters) with its AdamW
state (three times the model's bytes in all), is saved and loaded by every contender in one
run, alternating which goes first; each figure is min / median / max over ``--repeats``.

* ``torch.save`` (no fsync) and ``torch.save + fsync`` (the file and its directory): the
  like-for-like durability baseline for a save; ``torch.load(weights_only=True)`` for a load.
* ``accel storage``: :class:`accel.checkpoint.CheckpointWriter`/``CheckpointReader`` of the
  model and optimizer state dicts (sha256 of every byte, fsync of every file and directory,
  manifest, atomic rename; every byte read verified against the manifest before it is parsed).
* ``accel save_state``: ``Accelerator.save_state``/``load_state`` (single process), which also
  writes RNG states and loader positions, and loads into the model and optimizer.
* ``Accelerate save_state``: Hugging Face Accelerate's own, when installed (``--no-accelerate``
  leaves it out); it neither fsyncs nor verifies anything.
* ``sha256``: hashing the same bytes on one core, the floor of any verified format.

Each load runs right after the same contender's save, so it reads from the page cache, for
every contender alike (the machine's disk is not measured by the loads). Wall seconds are the
figures; CPU seconds (all threads) are printed beside them.

Run:  python benchmarks/bench_checkpoint.py [--mb 136] [--repeats 5] [--dir /tmp] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import add_common_args, has_accelerate, machine_line, median, record

from accel import Accelerator
from accel.checkpoint import CheckpointReader, CheckpointWriter

__all__ = ["main"]

BENCH = "bench_checkpoint"
WIDTH = 1024


def _model(megabytes: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    layers = max(1, round(megabytes * 1e6 / (4 * (WIDTH * WIDTH + WIDTH))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, WIDTH)).sum().backward()
    opt.step()
    return model, opt


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(state: dict[str, Any]) -> None:
    sha = hashlib.sha256()
    tensors = [*state["model"].values(),
               *(v for s in state["optimizer"]["state"].values() for v in s.values())]
    for tensor in tensors:
        sha.update(memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()))


class _Contender:
    """One way to save and load the state: ``save(path)`` then ``load(path)``."""

    def __init__(self, name: str, save: Callable[[Path], object],
                 load: Callable[[Path], object] | None) -> None:
        self.name, self.save, self.load = name, save, load
        self.wall: dict[str, list[float]] = {"save": [], "load": []}
        self.cpu: dict[str, list[float]] = {"save": [], "load": []}

    def run(self, path: Path, keep: bool) -> None:
        for kind, fn in (("save", self.save), ("load", self.load)):
            if fn is None:
                continue
            start, start_cpu = time.perf_counter(), time.process_time()
            fn(path)
            if keep:
                self.wall[kind].append(time.perf_counter() - start)
                self.cpu[kind].append(time.process_time() - start_cpu)
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _contenders(megabytes: float, with_accelerate: bool) -> list[_Contender]:
    model, opt = _model(megabytes)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}

    def torch_save(path: Path, sync: bool) -> None:
        torch.save(state, path)
        if sync:
            _fsync(path)
            _fsync(path.parent)

    def storage_save(path: Path) -> None:
        writer = CheckpointWriter(path)
        writer.write_tensors("model.safetensors", state["model"])
        writer.write_state("optimizer", state["optimizer"])
        writer.finalize(step=1, world_size=1)

    def storage_load(path: Path) -> None:
        reader = CheckpointReader(path, prefetch=["model.safetensors", "optimizer"])
        reader.tensors("model.safetensors")
        reader.state("optimizer")

    acc = Accelerator(cpu=True)
    acc.prepare(*_model(megabytes))
    out = [_Contender("torch.save", lambda p: torch_save(p, False), None),
           _Contender("torch.save+fsync", lambda p: torch_save(p, True),
                      lambda p: torch.load(p, weights_only=True)),
           _Contender("accel storage", storage_save, storage_load),
           _Contender("accel save_state", acc.save_state, acc.load_state),
           _Contender("sha256", lambda p: _sha256(state), None)]
    if with_accelerate:
        import accelerate  # benchmarks only: the library never imports it

        theirs = accelerate.Accelerator(cpu=True)
        theirs.prepare(*_model(megabytes))
        out.append(_Contender("Accelerate save_state", theirs.save_state, theirs.load_state))
    return out


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.3f} / {median(values):.3f} / {max(values):.3f}"


def _report(contenders: dict[str, _Contender], nbytes: int, quick: bool) -> None:
    print(f"{'contender':<28}{'save s: min / median / max':>30}{'cpu s':>7}"
          f"{'load s: min / median / max':>30}{'cpu s':>7}")
    for c in contenders.values():
        load_cpu = median(c.cpu["load"])
        print(f"{c.name:<28}{_cell(c.wall['save']):>30}{median(c.cpu['save']):>7.3f}"
              f"{_cell(c.wall['load']):>30}{load_cpu:>7.3f}")
    base_save = contenders["torch.save+fsync"].wall["save"]
    base_load = contenders["torch.save+fsync"].wall["load"]
    theirs = contenders.get("Accelerate save_state")
    note = "loads read from the page cache (right after the save), for every contender alike"
    rows: list[tuple[str, str, list[float], list[float], str, list[float] | None]] = []
    for name in ("accel storage", "accel save_state"):
        ours = contenders[name]
        rows.append((f"{name} save / (torch.save + fsync)", "save", ours.wall["save"], base_save,
                     "torch.save+fsync", theirs.wall["save"] if theirs else None))
        rows.append((f"{name} load / torch.load(weights_only=True)", "load", ours.wall["load"],
                     base_load, "torch.load", theirs.wall["load"] if theirs else None))
    if theirs is not None:
        ours = contenders["accel save_state"]
        for kind in ("save", "load"):
            rows.append((f"accel save_state {kind} / Accelerate save_state {kind}", kind,
                         ours.wall[kind], theirs.wall[kind], "accelerate", None))
    print(f"\nratios of median seconds ({nbytes / 1e6:.0f} MB; target: <= 1.00, "
          "i.e. accel at least as fast)")
    for figure, _kind, accel_s, base_s, base_name, accelerate_s in rows:
        rec = record(BENCH, figure, accel=accel_s, baseline=base_s, baseline_name=base_name,
                     accelerate=accelerate_s, unit="s", target=1.0, note=note)
        verdict = "(quick: not meaningful)" if quick else ("met" if rec["met"] else "MISSED")
        print(f"  {figure:<62}{rec['ratio']:>6.2f}  target <= 1.00  {verdict}")
    sha = median(contenders["sha256"].wall["save"])
    print(f"  floor: sha256 of the same bytes on one core: {sha:.3f} s "
          f"({nbytes / 1e6 / sha:.0f} MB/s)")
    print(f"note: {note}.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=136,
                        help="model size in MB (default 136: ~34M float32 parameters; AdamW "
                             "adds twice as much)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    add_common_args(parser, repeats=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.mb, args.repeats = min(args.mb, 4), 2
    with_accelerate = has_accelerate() and not args.no_accelerate
    contenders = {c.name: c for c in _contenders(args.mb, with_accelerate)}
    layers = max(1, round(args.mb * 1e6 / (4 * (WIDTH * WIDTH + WIDTH))))
    nbytes = 3 * 4 * layers * (WIDTH * WIDTH + WIDTH)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    load_before = os.getloadavg()[0]
    order = list(contenders.values())
    try:
        for index in range(1 + args.repeats):  # the first round is a warm-up
            shift = index % len(order)
            for c in order[shift:] + order[:shift]:
                c.run(work / f"{c.name.replace(' ', '_')}_{index}", keep=index > 0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = layers * (WIDTH * WIDTH + WIDTH)
    print(f"Checkpoint save/load of {nbytes / 1e6:.0f} MB ({params / 1e6:.1f}M "
          f"parameters + AdamW state), single process, {args.repeats} alternated repeats, "
          f"dir {args.dir or tempfile.gettempdir()}")
    print(f"{machine_line()} (load average before: {load_before:.1f})")
    _report(contenders, nbytes, args.quick)


if __name__ == "__main__":
    main()
