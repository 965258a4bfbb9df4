"""Shared helpers for the benchmark scripts: interleaved timing, medians, tables, workers.

Every benchmark measures accel and its plain-PyTorch baseline side by side in the same run,
interleaving the repeats (and rotating which variant goes first) so that drift on a busy
machine hits both alike. Tables show medians and the ratio to the first (baseline) column.

Example:
    >>> wall, cpu = interleave({"a": lambda: None, "b": lambda: None}, repeats=3)
    >>> sorted(wall), len(cpu["a"])
    (['a', 'b'], 3)
    >>> print(format_table("demo", ["case", "a", "b"], [["x", 0.001, 0.002]], ratio_of=("b",)))
    ... # doctest: +NORMALIZE_WHITESPACE
    demo
    case        a        b  b / a
    x     1.00 ms  2.00 ms   2.00
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import queue
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["RESULTS_ENV", "Loop", "accelerators", "add_common_args", "format_seconds",
           "format_table", "free_port", "has_accelerate", "interleave", "machine_line",
           "median", "python", "ratio", "record", "run_workers", "spread", "spread_lines",
           "time_command"]


class Loop:
    """Endless batches from a loader (a new epoch when one ends; ``on_epoch(epoch)`` then, e.g.
    ``DistributedSampler.set_epoch``)."""

    def __init__(self, loader: Any, on_epoch: Callable[[int], None] | None = None) -> None:
        self.loader, self.on_epoch, self.epoch = loader, on_epoch, 0
        self.iterator: Iterator[Any] = iter(loader)

    def batch(self) -> Any:
        try:
            return next(self.iterator)
        except StopIteration:
            self.epoch += 1
            if self.on_epoch is not None:
                self.on_epoch(self.epoch)
            self.iterator = iter(self.loader)
            return next(self.iterator)


def median(values: Sequence[float]) -> float:
    """Median of ``values`` (``nan`` when empty)."""
    return statistics.median(values) if values else float("nan")


def ratio(value: float, baseline: float) -> float:
    """``value / baseline`` (``nan`` when the baseline is 0 or missing)."""
    return value / baseline if baseline else float("nan")


def has_accelerate() -> bool:
    """Whether Hugging Face ``accelerate`` is importable (an optional extra column)."""
    return importlib.util.find_spec("accelerate") is not None


def format_seconds(seconds: float) -> str:
    """``1.23 ms`` style, picking s / ms / us by size."""
    if seconds != seconds:  # nan
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def spread(values: Sequence[float], fmt: Callable[[float], str] = format_seconds) -> str:
    """``min / median / max`` of ``values`` (seconds unless ``fmt`` says otherwise).

    Example:
        >>> spread([0.003, 0.001, 0.002])
        '1.00 ms / 2.00 ms / 3.00 ms'
    """
    if not values:
        return "-"
    return " / ".join(fmt(v) for v in (min(values), median(values), max(values)))


def spread_lines(what: str, results: Mapping[str, Mapping[str, Sequence[float]]],
                 columns: Sequence[str]) -> str:
    """``min / median / max`` of every row (``results[row][column]``), one line per row."""
    lines = [f"min / median / max {what}:"]
    for name, times in results.items():
        lines.append(f"  {name}: " + "; ".join(f"{c} {spread(times[c])}" for c in columns))
    return "\n".join(lines)


def format_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
                 ratio_of: Sequence[str] = ()) -> str:
    """A plain-text table; float cells are seconds. For each column named in ``ratio_of`` a
    ``col / baseline`` column is added, where the baseline is the first value column."""
    header = list(header)
    baseline_name = header[1]
    extra = [f"{name} / {baseline_name}" for name in ratio_of]
    lines = [header + extra]
    for row in rows:
        cells = [str(row[0])] + [format_seconds(v) if isinstance(v, float) else str(v)
                                 for v in row[1:]]
        for name in ratio_of:
            value = row[header.index(name)]
            value = value if isinstance(value, float) else float("nan")
            ratio_value = ratio(value, row[1]) if isinstance(row[1], float) else float("nan")
            cells.append("-" if ratio_value != ratio_value else f"{ratio_value:.2f}")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = [title]
    for line in lines:
        first = line[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=False)]
        text.append("  ".join([first] + rest))
    return "\n".join(text)


def interleave(variants: Mapping[str, Callable[[], object]], repeats: int, warmup: int = 0
               ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every variant ``repeats`` times, alternating them and rotating which goes first.

    Returns ``(wall, cpu)``: seconds of wall clock and of this process's CPU time (all
    threads) per run of each variant. CPU time shows overhead even on a machine so busy that
    wall-clock figures mostly measure waiting for a core.
    """
    names = list(variants)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + repeats):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if index >= warmup:
                wall[name].append(elapsed)
                cpu[name].append(elapsed_cpu)
    return wall, cpu


def time_command(argv: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> float:
    """Wall time of one run of ``argv`` (output discarded); raises if it fails."""
    start = time.perf_counter()
    done = subprocess.run(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stderr}")
    return elapsed


def machine_line() -> str:
    """One line describing where the figures come from."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"python {platform.python_version()}, torch {torch.__version__}, "
            f"{os.cpu_count()} CPUs, load average {load:.1f}")


def add_common_args(parser: argparse.ArgumentParser, repeats: int) -> None:
    parser.add_argument("--repeats", type=int, default=repeats,
                        help=f"measured repeats per variant (default {repeats})")
    parser.add_argument("--quick", action="store_true",
                        help="tiny repeat counts: proves the script runs, figures mean nothing")
    parser.add_argument("--no-accelerate", action="store_true",
                        help="leave Hugging Face accelerate out even when it is installed")


def accelerators(use_accelerate: bool) -> tuple[Any, Any]:
    """accel's ``Accelerator(cpu=True)`` (it starts the gloo group every variant shares) and,
    when asked, Hugging Face Accelerate's on the same group (else None)."""
    from accel import Accelerator

    ours = Accelerator(cpu=True)
    theirs = None
    if use_accelerate:
        import accelerate

        theirs = accelerate.Accelerator(cpu=True)
    return ours, theirs


# -- machine-readable results ----------------------------------------------------------------
#: run_all.sh sets it to a JSON-lines file; every figure a script prints is also appended there
RESULTS_ENV = "ACCEL_BENCH_RESULTS"


def record(benchmark: str, figure: str, *, accel: Sequence[float] | float,
           baseline: Sequence[float] | float, baseline_name: str = "torch",
           accelerate: Sequence[float] | float | None = None, unit: str = "s",
           target: float | None = None, higher_is_better: bool = False,
           note: str = "") -> dict[str, Any]:
    """One figure (accel against its plain-PyTorch baseline, measured in the same run) as a
    record; appended as one JSON line to ``$ACCEL_BENCH_RESULTS`` when that is set.

    ``accel``/``baseline``/``accelerate`` are the samples (or one value). ``ratio`` is
    median(accel) / median(baseline) (for ``higher_is_better`` figures such as MB/s it is
    baseline / accel, so that below 1 is always better for accel); ``target`` bounds it.

    Example:
        >>> r = record("bench_x", "case", accel=[2.0, 2.2, 1.8], baseline=[1.0, 1.0, 1.0],
        ...            target=2.5)
        >>> r["ratio"], r["met"], r["accel"]["min"], r["accelerate"]
        (2.0, True, 1.8, None)
    """
    def stats(values: Sequence[float] | float | None) -> dict[str, float] | None:
        if values is None:
            return None
        samples = ([float(values)] if isinstance(values, (int, float))
                   else [float(v) for v in values])
        return {"median": median(samples), "min": min(samples), "max": max(samples),
                "n": len(samples)}

    ours, base, theirs = stats(accel), stats(baseline), stats(accelerate)
    assert ours is not None and base is not None
    value = (ratio(base["median"], ours["median"]) if higher_is_better
             else ratio(ours["median"], base["median"]))
    rec: dict[str, Any] = {
        "benchmark": benchmark, "figure": figure, "unit": unit, "accel": ours,
        "baseline": base, "baseline_name": baseline_name, "accelerate": theirs,
        "ratio": value, "target": target, "higher_is_better": higher_is_better,
        "met": None if target is None else bool(value <= target), "note": note,
        "machine": machine_line()}
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(rec, sort_keys=True) + "\n")
    return rec


# -- worker processes -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "MV2_", "SLURM_", "ACCEL_")


def _child(fn: Callable[..., Any], rank: int, env: Mapping[str, str], args: tuple[Any, ...],
           results: Any) -> None:
    for name in list(os.environ):
        if name.startswith(_LAUNCHER_PREFIXES):
            del os.environ[name]
    os.environ.update(env)
    try:
        results.put((rank, "ok", fn(rank, *args)))
    except BaseException:  # noqa: BLE001 - report everything to the parent, which re-raises
        results.put((rank, "error", traceback.format_exc()))


def run_workers(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = (),
                timeout: float = 900.0) -> list[Any]:
    """Run module-level ``fn(rank, *args)`` in ``world_size`` processes with a torchrun-style
    environment (spawn start method); return each rank's value in rank order."""
    ctx = mp.get_context("spawn")
    port = free_port()
    results = ctx.Queue()
    procs = []
    for rank in range(world_size):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        proc = ctx.Process(target=_child, args=(fn, rank, env, args, results), daemon=True)
        proc.start()
        procs.append(proc)
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"benchmark workers did not finish within {timeout:.0f} s")
            try:
                rank, status, value = results.get(timeout=min(left, 5.0))
            except queue.Empty:  # check that nobody died silently
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a benchmark worker exited with {dead[0]}") from None
                continue
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            values[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    return [values[r] for r in range(world_size)]


def python() -> str:
    """The interpreter running the benchmarks (children use the same one)."""
    return sys.executable
