"""Checkpoint save/load throughput: accel's format vs torch.save / torch.load(weights_only=True).

The same state (a model of ~100 MB plus its Adam state, ~300 MB in all) is saved and loaded
with both, side by side in one run, alternating which goes first; medians over repeats.

accel's save includes what makes it safe: sha256 of every byte, fsync of every file and
directory, manifest, atomic rename. Its load verifies every file's sha256 before parsing.
``torch.save + fsync`` is shown too, as the like-for-like durability baseline, and the time to
sha256 the same bytes on one core, the floor for any verified format. Wall and CPU seconds
(all threads) are printed: on a busy machine, wall times of the threaded paths suffer most.

Run:  python benchmarks/bench_checkpoint.py [--mb 100] [--repeats 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from accel.checkpoint import CheckpointReader, CheckpointWriter

__all__ = ["main"]


def _state(megabytes: int) -> tuple[dict[str, Any], int]:
    width = 1024
    layers = max(1, round(megabytes * 1e6 / (4 * (width * width + width))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values()) * 3
    return state, nbytes


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _accel_save(state: dict[str, Any], target: Path) -> None:
    writer = CheckpointWriter(target)
    writer.write_tensors("model.safetensors", state["model"])
    writer.write_state("optimizer", state["optimizer"])
    writer.finalize(step=1, world_size=1)


def _accel_load(target: Path) -> dict[str, Any]:
    reader = CheckpointReader(target, prefetch=["model.safetensors", "optimizer"])
    return {"model": reader.tensors("model.safetensors"), "optimizer": reader.state("optimizer")}


def _torch_save(state: dict[str, Any], target: Path, sync: bool) -> None:
    torch.save(state, target)
    if sync:
        _fsync(target)
        _fsync(target.parent)


def _time(fn: Callable[[], Any], cpu: list[float]) -> float:
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    cpu.append(time.process_time() - start_cpu)  # all threads of this process
    return time.perf_counter() - start


def _sha256(state: dict[str, Any]) -> None:
    sha = hashlib.sha256()
    for tensor in [*state["model"].values(), *(v for s in state["optimizer"]["state"].values()
                                               for v in s.values())]:
        sha.update(memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


_KEYS = ("torch.save", "torch.save+fsync", "accel save", "torch.load", "accel load", "sha256")


def _run(state: dict[str, Any], work: Path, repeats: int) -> tuple[dict[str, list[float]],
                                                                   dict[str, list[float]]]:
    times: dict[str, list[float]] = {k: [] for k in _KEYS}
    cpu: dict[str, list[float]] = {k: [] for k in _KEYS}
    for i in range(repeats):
        pt, ours = work / f"state_{i}.pt", work / f"checkpoint_{i}"
        order = [0, 1] if i % 2 == 0 else [1, 0]
        for which in order:
            if which == 0:
                times["torch.save"].append(_time(partial(_torch_save, state, pt, False),
                                                 cpu["torch.save"]))
                _remove(pt)
                times["torch.save+fsync"].append(_time(partial(_torch_save, state, pt, True),
                                                       cpu["torch.save+fsync"]))
                times["torch.load"].append(_time(partial(torch.load, pt, weights_only=True),
                                                 cpu["torch.load"]))
            else:
                times["accel save"].append(_time(partial(_accel_save, state, ours),
                                                 cpu["accel save"]))
                times["accel load"].append(_time(partial(_accel_load, ours), cpu["accel load"]))
        times["sha256"].append(_time(lambda: _sha256(state), cpu["sha256"]))
        _remove(pt)
        _remove(ours)
    return times, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="model size in MB (Adam adds 2x)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    state, nbytes = _state(args.mb)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir))
    load_before = os.getloadavg()[0]
    try:
        _run(state, work, 1)  # warm-up: allocator, page cache, lazy imports
        times, cpu = _run(state, work, args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    mbs = {k: nbytes / 1e6 / v for k, v in med.items()}
    print(f"state: {nbytes / 1e6:.0f} MB (model + Adam), torch {torch.__version__}, "
          f"{args.repeats} repeats, medians, dir {args.dir or tempfile.gettempdir()}, "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'operation':<38}{'wall s':>8}{'cpu s':>8}{'MB/s':>8}{'accel/torch':>13}")
    rows = [("save  torch.save (no fsync)", "torch.save", None),
            ("save  torch.save + fsync", "torch.save+fsync", None),
            ("save  accel (sha256+fsync+manifest)", "accel save", "torch.save"),
            ("  ... vs torch.save + fsync", "accel save", "torch.save+fsync"),
            ("load  torch.load(weights_only=True)", "torch.load", None),
            ("load  accel (sha256 verified)", "accel load", "torch.load"),
            ("floor: sha256 of the bytes, one core", "sha256", None)]
    for label, key, base in rows:
        ratio = f"{mbs[key] / mbs[base]:.2f}x" if base else ""
        print(f"{label:<38}{med[key]:>8.3f}{med_cpu[key]:>8.3f}{mbs[key]:>8.0f}{ratio:>13}")


if __name__ == "__main__":
    main()
