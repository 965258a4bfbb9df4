"""Sharded checkpoint save/load of an FSDP run: accel's save_state/load_state vs DCP's own.

Two processes (gloo, CPU) shard a ~20M-parameter model with FSDP2 (``Accelerator(fsdp_plugin=
FullyShardedDataParallelPlugin())``) and its AdamW state (~240 MB in all). Each repeat saves and
loads the same state both ways, alternating which goes first:

* ``dcp``: ``torch.distributed.checkpoint.save``/``load`` with its ``FileSystemWriter``/
  ``Reader`` (pickled ``.metadata``, fsync of every file) of ``get_model_state_dict`` and
  ``get_optimizer_state_dict``; the baseline.
* ``accel``: ``accelerator.save_state(dir)``/``load_state(dir)``: the same DCP engine over
  pickle-free safetensors shards, every byte hashed while written and verified before use,
  RNG states and a manifest, in a temporary directory renamed into place.

Times are wall seconds on rank 0 between barriers (min / median / max); the ratio is accel's
median over DCP's (time; throughput is its inverse). Both figures are recorded with
``_common.record`` (no target: DCP neither hashes, verifies nor renames anything into place;
accel's load hashes every file it reads against the manifest before any byte is used). Loads
read from the page cache (the files were just written), for both alike.

Run:  python benchmarks/bench_sharded_checkpoint.py [--layers 19] [--repeats 5] [--dir /tmp]
      [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import format_seconds, interleave, machine_line, record, run_workers

__all__ = ["main"]


def _worker(rank: int, layers: int, repeats: int, root: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from accel import Accelerator, FullyShardedDataParallelPlugin

    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    module = acc.unwrap_model(model)
    counter = iter(range(10**6))

    def timed(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            dist.barrier()
            fn()
            dist.barrier()
        return run

    def fresh(kind: str) -> str:
        return f"{root}/{kind}_{next(counter)}"

    def dcp_save() -> None:
        state = {"model": get_model_state_dict(module),
                 "optim": get_optimizer_state_dict(module, opt.optimizer)}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(fresh("dcp")))

    def dcp_load() -> None:
        state = {"model": get_model_state_dict(module),
                 "optim": get_optimizer_state_dict(module, opt.optimizer)}
        dcp.load(state, storage_reader=dcp.FileSystemReader(f"{root}/dcp_ref"))
        set_model_state_dict(module, state["model"])
        set_optimizer_state_dict(module, opt.optimizer, state["optim"])

    dcp.save({"model": get_model_state_dict(module),
              "optim": get_optimizer_state_dict(module, opt.optimizer)},
             storage_writer=dcp.FileSystemWriter(f"{root}/dcp_ref"))
    acc.save_state(f"{root}/accel_ref")
    save, _ = interleave({"dcp": timed(dcp_save),
                          "accel": timed(lambda: acc.save_state(fresh("accel")))},
                         repeats, warmup=1)
    load, _ = interleave({"dcp": timed(dcp_load),
                          "accel": timed(lambda: acc.load_state(f"{root}/accel_ref"))},
                         repeats, warmup=1)
    nbytes = sum(p.numel() * p.element_size() for p in module.parameters()) * 3
    acc.wait_for_everyone()
    return {"save": save, "load": load, "bytes": nbytes}


def _row(name: str, times: dict[str, list[float]]) -> str:
    cells = []
    for kind in ("dcp", "accel"):
        values = sorted(times[kind])
        cells.append(" / ".join(format_seconds(v) for v in
                                (values[0], values[len(values) // 2], values[-1])))
    ratio = sorted(times["accel"])[len(times["accel"]) // 2] / \
        sorted(times["dcp"])[len(times["dcp"]) // 2]
    return f"{name:<6}{cells[0]:>36}{cells[1]:>36}{ratio:>10.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=19,
                        help="Linear(1024, 1024) layers (19: ~20M parameters)")
    parser.add_argument("--repeats", type=int, default=5, help="measured repeats (>= 5)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--quick", action="store_true",
                        help="2 layers, 2 repeats: proves the script runs, figures mean nothing")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.repeats = min(args.layers, 2), 2
    root = tempfile.mkdtemp(prefix="bench_sharded_", dir=args.dir)
    try:
        start = time.perf_counter()
        result = run_workers(_worker, 2, args=(args.layers, args.repeats, root))[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"sharded checkpoint, 2 processes, {result['bytes'] / 1e6:.0f} MB of model + AdamW "
          f"state, {args.repeats} repeats ({time.perf_counter() - start:.0f} s)")
    print(machine_line())
    print(f"{'':<6}{'dcp min / median / max':>36}{'accel min / median / max':>36}"
          f"{'accel/dcp':>10}")
    print(_row("save", result["save"]))
    print(_row("load", result["load"]))
    note = "2 processes, gloo; loads read from the page cache, for both alike"
    for kind in ("save", "load"):
        record("bench_sharded_checkpoint", f"FSDP sharded {kind} (accel save_state/load_state "
               "/ DCP)", accel=result[kind]["accel"], baseline=result[kind]["dcp"],
               baseline_name="dcp", note=note)


if __name__ == "__main__":
    main()
