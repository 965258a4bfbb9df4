"""Soak: thousands of training steps with evaluation and checkpoints; does anything grow?

Two 2-process jobs run at the same time (gloo, CPU), each for ``--steps`` steps of a small
MLP: accel (a prepared model, optimizer and loaders; ``gather_for_metrics`` over a prepared
evaluation loader every ``--eval_every`` steps; ``save_state()`` with ``total_limit=2`` every
``--save_every`` steps) and the same loop in plain PyTorch (DDP, ``DistributedSampler``,
``all_gather`` per evaluation batch and truncation of the padding, ``torch.save`` + rotation).
After a warm-up, every ``--sample_every`` steps each rank samples:

- ``rss_mib``: resident memory (``VmRSS``); ``fds``: open file descriptors; ``threads``: OS
  threads (``Threads``); ``children``: live child processes;
- ``process_groups``: live process groups torch knows (``distributed_c10d._world.pg_map``);
- ``store_keys``: keys in the job's c10d store (``num_keys()``; the store lives on rank 0);
- ``py_objects``: objects tracked by Python's garbage collector.

Per metric and rank it fits a least-squares line and prints its slope per 1000 steps next to
plain PyTorch's, with a verdict: flat when the slope is under the stated threshold, or no more
than that threshold above plain PyTorch's slope on the same rank (growth the plain loop shows
too, such as the allocator's, is not accel's). The warm-up covers at least two saves and two
evaluations, so that what a checkpoint or an evaluation keeps for the next one is in place
before the first sample. Not in CI (``--quick`` only proves that it runs).

Run:  python benchmarks/soak.py [--steps 5000] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

__all__ = ["THRESHOLDS", "main", "slope"]

#: the largest slope (per 1000 steps) that is still "flat"; a leak of one file descriptor,
#: thread, child, group or store key per 10,000 steps is caught, and of 1 KiB per step of RSS
THRESHOLDS = {"rss_mib": 1.0, "fds": 0.1, "threads": 0.1, "children": 0.1,
              "process_groups": 0.1, "store_keys": 0.1, "py_objects": 50.0}
VARIANTS = ("torch", "accel")


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 with fewer than 2 points).

    Example:
        >>> slope([0, 1, 2, 3], [1, 3, 5, 7])
        2.0
    """
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def _status_field(name: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return float(line.split()[1])
    return float("nan")


def _children() -> int:
    me, count = os.getpid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rpartition(")")[2].split()
            except OSError:
                continue
            count += int(fields[1]) == me and fields[0] != "Z"
    return count


def sample(own: int = 0) -> dict[str, float]:
    """This process's metrics now (see the module docstring); ``own``: objects the soak itself
    keeps (one per sample taken so far), not counted."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    world = getattr(c10d, "_world", None)
    groups = float(len(world.pg_map)) if world is not None else float("nan")
    keys = float("nan")
    if dist.is_initialized():
        keys = float(c10d._get_default_store().num_keys())
    gc.collect()
    return {"rss_mib": _status_field("VmRSS") / 1024,
            "fds": float(len(os.listdir("/proc/self/fd"))),
            "threads": _status_field("Threads"), "children": float(_children()),
            "process_groups": groups, "store_keys": keys,
            "py_objects": float(len(gc.get_objects()) - own)}


def _data(rank: int) -> tuple[Any, Any]:
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 32, generator=g)
    y = x.sum(1, keepdim=True)
    xe = torch.randn(203, 32, generator=g)  # not a multiple of 2 x 16: a padded last batch
    return TensorDataset(x, y), TensorDataset(xe, xe.sum(1, keepdim=True))


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))


class _Plan:
    def __init__(self, args: dict[str, int]) -> None:
        self.steps, self.eval_every = args["steps"], args["eval_every"]
        self.save_every, self.sample_every = args["save_every"], args["sample_every"]
        self.warmup = args["warmup"]
        self.samples: list[tuple[int, dict[str, float]]] = []

    def after(self, step: int, evaluate: Any, save: Any) -> None:
        if step % self.eval_every == 0:
            evaluate()
        if step % self.save_every == 0:
            save()
        if step % self.sample_every == 0 and step >= self.warmup:
            self.samples.append((step, sample(own=len(self.samples))))


def _accel_job(rank: int, args: dict[str, int], root: str) -> list[tuple[int, dict[str, float]]]:
    import torch
    from torch.utils.data import DataLoader

    from accel import Accelerator, ProjectConfiguration

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=root, automatic_checkpoint_naming=True, total_limit=2))
    train, evalset = _data(rank)
    model, opt, train_dl, eval_dl = acc.prepare(
        _model(), torch.optim.AdamW(_model().parameters(), lr=1e-3),
        DataLoader(train, batch_size=16, shuffle=True), DataLoader(evalset, batch_size=16))
    loop, plan = _common.Loop(train_dl), _Plan(args)

    def evaluate() -> None:
        model.eval()
        with torch.no_grad():
            for xb, yb in eval_dl:
                preds, labels = acc.gather_for_metrics((model(xb), yb))
        assert len(preds) == len(labels)
        model.train()

    for step in range(1, plan.steps + 1):
        xb, yb = loop.batch()
        acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
        opt.step()
        opt.zero_grad()
        plan.after(step, evaluate, acc.save_state)
    acc.end_training()
    return plan.samples


def _torch_job(rank: int, args: dict[str, int], root: str) -> list[tuple[int, dict[str, float]]]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    train, evalset = _data(rank)
    model = DistributedDataParallel(_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(train, shuffle=True)
    loop = _common.Loop(DataLoader(train, batch_size=16, sampler=sampler), sampler.set_epoch)
    eval_dl = DataLoader(evalset, batch_size=16, sampler=DistributedSampler(evalset,
                                                                             shuffle=False))
    plan, saved = _Plan(args), []

    def evaluate() -> None:
        model.eval()
        got = []
        with torch.no_grad():
            for xb, _yb in eval_dl:
                out = model(xb)
                parts = [torch.empty_like(out) for _ in range(world)]
                dist.all_gather(parts, out)
                got.append(torch.cat(parts))
        assert len(torch.cat(got)[:len(evalset)]) == len(evalset)
        model.train()

    def save() -> None:
        if rank == 0:
            path = Path(root) / f"checkpoint_{len(saved)}.pt"
            with open(path, "wb") as fh:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            saved.append(path)
            if len(saved) > 2:
                saved[-3].unlink()
        dist.barrier()

    for step in range(1, plan.steps + 1):
        xb, yb = loop.batch()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
        plan.after(step, evaluate, save)
    dist.destroy_process_group()
    return plan.samples


def _soak(rank: int, variant: str, args: dict[str, int], root: str
          ) -> list[tuple[int, dict[str, float]]]:
    os.makedirs(root, exist_ok=True)
    job = _accel_job if variant == "accel" else _torch_job
    return job(rank, args, root)


def _run(variant: str, args: dict[str, int], root: str, out: dict[str, Any]) -> None:
    try:
        out[variant] = _common.run_workers(_soak, 2, args=(variant, args, root), timeout=7200)
    except BaseException as exc:  # noqa: BLE001 - re-raised by the main thread
        out[variant] = exc


def slopes(samples: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Per metric, the least-squares slope per 1000 steps."""
    xs = [float(step) for step, _ in samples]
    return {name: 1000 * slope(xs, [m[name] for _, m in samples]) for name in THRESHOLDS}


def _warmup(opts: argparse.Namespace) -> int:
    """Steps before the first sample: a tenth of the run, and at least two saves and two
    evaluations (plus one sampling period) so that the state they keep is in place."""
    return max(1, opts.steps // 10,
               2 * max(opts.save_every, opts.eval_every) + opts.sample_every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--eval_every", type=int, default=100)
    parser.add_argument("--save_every", type=int, default=250)
    parser.add_argument("--sample_every", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=None,
                        help="default: steps / 10, at least 2 saves and evaluations")
    parser.add_argument("--quick", action="store_true", help="300 steps: proves it runs")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.steps, opts.eval_every, opts.save_every, opts.sample_every = 300, 25, 50, 20
    args = {"steps": opts.steps, "eval_every": opts.eval_every, "save_every": opts.save_every,
            "sample_every": opts.sample_every,
            "warmup": opts.warmup if opts.warmup is not None else _warmup(opts)}
    print(f"Soak: {opts.steps} steps, 2 processes (gloo), gather_for_metrics every "
          f"{opts.eval_every}, save_state every {opts.save_every} (total_limit 2), samples "
          f"every {opts.sample_every} after step {args['warmup']}; accel and plain PyTorch "
          f"at the same time", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        threads = [threading.Thread(target=_run, args=(v, args, f"{tmp}/{v}", results))
                   for v in VARIANTS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for variant in VARIANTS:
        if isinstance(results[variant], BaseException):
            raise results[variant]
    fitted = {v: [slopes(rank_samples) for rank_samples in results[v]] for v in VARIANTS}
    flat = True
    rows = []
    for name, limit in THRESHOLDS.items():
        ours = [s[name] for s in fitted["accel"]]
        base = [s[name] for s in fitted["torch"]]
        # growth the plain loop shows as much (the allocator's) is not accel's
        grows = any(v >= max(limit, b + limit) for v, b in zip(ours, base, strict=True))
        verdict = "GROWS" if grows else "flat"
        flat &= verdict == "flat"
        first = [results["accel"][r][0][1][name] for r in range(2)]
        last = [results["accel"][r][-1][1][name] for r in range(2)]
        rows.append([name, *(f"{v:+.3f}" for v in base + ours),
                     " -> ".join("/".join(f"{v:g}" for v in vs) for vs in (first, last)),
                     f"< {limit:g}", verdict])
        _common.record("soak", f"{name} slope per 1000 steps", accel=ours, baseline=base,
                       unit=f"{name}/1000 steps",
                       note=f"flat below {limit:g}; {opts.steps} steps; verdict {verdict}")
    header = ["metric", "torch r0", "torch r1", "accel r0", "accel r1",
              "accel first -> last (r0/r1)", "flat if below (or torch +)", "accel"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print("Slope per 1000 steps (least squares over the samples after the warm-up)")
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) if i in (0, 5) else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print(f"verdict: {'flat' if flat else 'something GROWS'} ({len(results['accel'][0])} "
          f"samples per rank)" + (" (--quick: too few steps, the verdict means nothing)"
                                  if opts.quick else ""))
    print(_common.machine_line())
    return 0 if flat or opts.quick else 1


if __name__ == "__main__":
    sys.exit(main())
