"""What ``hvd.elastic`` costs: ``state.commit()`` against a training step and plain baselines.

A commit writes the model, the optimizer, the sampler and the plain values into one atomic,
pickle-free checkpoint directory (sha256, fsync, manifest, rename) and removes the previous
one; it runs no collective, so one process measures it. Side by side in the same run:

- ``step``: one training step (forward, backward, Adam step) on a batch of 32;
- ``deepcopy``: what Horovod's own commit does (copies of the state dicts in memory);
- ``torch.save+fsync``: the state written with torch.save (pickle) and fsynced;
- ``commit``: ``hvd.elastic.TorchState.commit()``.

The last column is the overhead per step of committing every N steps (commit / (N * step)).
Min / median / max of every variant follow the table (at least 5 repeats).

Run:  python benchmarks/bench_horovod_elastic.py [--repeats 7] [--dir /tmp] [--every 10]
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from _common import (
    add_common_args,
    format_table,
    interleave,
    machine_line,
    median,
    record,
    spread_lines,
)

__all__ = ["main"]

TARGET = 1.5  # commit / torch.save+fsync


def _setup(megabytes: float) -> tuple[Any, Any, Any]:
    width = 512
    layers = max(1, round(megabytes * 1e6 / (4 * (width * width + width))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = torch.randn(32, width)
    return model, optimizer, batch


def _torch_save(state: dict[str, Any], path: Path) -> None:
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _case(megabytes: float, directory: Path, repeats: int, every: int
          ) -> tuple[list[Any], dict[str, list[float]]]:
    """The table row of one state size, and every variant's samples."""
    import accel.horovod as hvd

    model, optimizer, batch = _setup(megabytes)
    sampler = hvd.elastic.ElasticSampler(list(range(10_000)))
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    def step() -> None:
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        state.batch += 1
        sampler.record_batch(state.batch, 32)

    def full() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "sampler": sampler.state_dict(), "epoch": state.epoch, "batch": state.batch}

    step()  # the optimizer state exists before anything is measured
    wall, _cpu = interleave({
        "step": step,
        "deepcopy": lambda: copy.deepcopy(full()),
        "torch.save+fsync": lambda: _torch_save(full(), directory / "torch_state.pt"),
        "commit": state.commit,
    }, repeats=repeats, warmup=1)
    state.clear_commits()
    step_s, commit_s = median(wall["step"]), median(wall["commit"])
    save_s = median(wall["torch.save+fsync"])
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    return [f"{nbytes / 1e6:.0f} MB", step_s, median(wall["deepcopy"]), save_s, commit_s,
            f"{commit_s / save_s:.2f}", f"{100 * commit_s / (every * step_s):.1f}%"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, repeats=7)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where the commits go (ACCEL_ELASTIC_DIR); default: the temp dir")
    parser.add_argument("--every", type=int, default=10, help="commit every N steps")
    args = parser.parse_args()
    repeats = 2 if args.quick else max(args.repeats, 5)
    sizes = [1.0] if args.quick else [1.0, 10.0, 100.0]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        os.environ["ACCEL_ELASTIC_DIR"] = tmp
        import accel.horovod as hvd

        hvd.init()
        torch.set_num_threads(1)
        cases = [_case(size, Path(tmp), repeats, args.every) for size in sizes]
        hvd.shutdown()
    print(machine_line())
    print(f"commits in {args.dir}; model + Adam state (3 x the parameters)")
    print(format_table(
        "Wall time of hvd.elastic's commit (medians)",
        ["state", "step", "deepcopy", "torch.save+fsync", "commit", "commit / torch.save",
         f"overhead, commit every {args.every} steps"], [row for row, _ in cases]))
    samples = {row[0]: wall for row, wall in cases}
    print(spread_lines(f"of {repeats} interleaved repeats", samples,
                       ["step", "deepcopy", "torch.save+fsync", "commit"]))
    print(f"target: commit / torch.save+fsync <= {TARGET} (a durable write of the same bytes)")
    for size, wall in samples.items():
        record("bench_horovod_elastic", f"hvd.elastic commit, {size} state",
               accel=wall["commit"], baseline=wall["torch.save+fsync"],
               baseline_name="torch.save+fsync", target=TARGET)


if __name__ == "__main__":
    main()
