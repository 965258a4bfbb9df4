"""Run a module-level worker function in N real processes over gloo.

One helper for every multi-process test: picks a free port, sets the launcher environment
inside each child (torchrun-style by default; tests may describe mpirun/srun instead), enforces a
timeout, and re-raises the first failing child's traceback in the test process.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["LAUNCHER_PREFIXES", "clean_env", "cpu_group", "free_port", "run_workers",
           "torchrun_env"]

LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "MV2_", "SLURM_", "ACCEL_")
LAUNCHER_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                  "CUDA_VISIBLE_DEVICES", "PJRT_DEVICE")


#: What an end-to-end job must not inherit from the test run (it starts as a user's job would).
_JOB_PREFIXES = ("ACCEL_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "SLURM_")
_JOB_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "OMP_NUM_THREADS")
_ROOT = Path(__file__).resolve().parents[1]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a job started by a test as a user would start it: the caller's minus
    launcher/ACCEL variables, this checkout first on ``PYTHONPATH``, no user config file (the
    config directory is under ``home``), then ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_JOB_PREFIXES) and k not in _JOB_NAMES}
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["XDG_CONFIG_HOME"] = str(home / "xdg")  # never pick up the developer's config
    env.update(extra)
    return env


def finish_launch(proc: Any, timeout: float) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of an ``accel launch`` started with ``Popen(text=True)``
    and piped output; killed, and the test failed, if it runs over ``timeout`` seconds."""
    import subprocess

    import pytest

    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"accel launch did not finish in {timeout} s:\n{out}\n{err}")
    return proc.returncode, out, err


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


EnvFactory = Callable[[int, int, int], Mapping[str, str]]


def _child(fn: Callable[..., Any], rank: int, env: Mapping[str, str], args: tuple[Any, ...],
           results: Any) -> None:
    for name in list(os.environ):
        if name in LAUNCHER_NAMES or name.startswith(LAUNCHER_PREFIXES):
            del os.environ[name]
    os.environ.update(env)
    # On a timeout the parent sends SIGUSR1: every thread's stack goes to stderr (a diagnosis).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        value = fn(rank, *args)
        results.put((rank, "ok", value))
    except BaseException:  # report everything, including SystemExit, to the parent
        results.put((rank, "error", traceback.format_exc()))


def _dump_stacks(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive() and proc.pid is not None:
            os.kill(proc.pid, signal.SIGUSR1)
    time.sleep(1.0)


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    # torch._dynamo is imported by the first Optimizer(): preloading it saves ~10 s per child.
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "accel"])
    return ctx


def run_workers(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    args: tuple[Any, ...] = (),
    env: EnvFactory | None = None,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 90.0,
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` processes; return the values in rank order.

    ``env(rank, world, port)`` builds each child's launcher variables (torchrun-style by
    default); ``extra_env`` is added for every rank.
    """
    ctx = _context()
    port = free_port()
    results = ctx.Queue()
    make_env = env or torchrun_env
    procs = []
    for rank in range(world_size):
        child_env = dict(make_env(rank, world_size, port))
        child_env.update(extra_env or {})
        proc = ctx.Process(target=_child, args=(fn, rank, child_env, args, results), daemon=True)
        proc.start()
        procs.append(proc)
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(values))
                _dump_stacks([procs[r] for r in missing])
                raise TimeoutError(f"ranks {missing} did not finish within {timeout:.0f} s "
                                   "(their stacks are in the captured stderr)")
            try:
                rank, status, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs)
                        if r not in values and p.exitcode is not None]
                if dead:
                    time.sleep(0.5)  # let a last message arrive
                    if results.empty():
                        codes = {r: procs[r].exitcode for r in dead}
                        raise RuntimeError(f"worker(s) died without a result: exit codes {codes}")
                continue
            if status == "error":
                raise AssertionError(f"rank {rank} of {world_size} failed:\n{value}")
            values[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return [values[r] for r in range(world_size)]


def cpu_group() -> tuple[Any, Any, Any]:
    """Inside a worker: accel's (ProcessContext, Communicator, ProcessGroupHandle) on gloo."""
    from accel.device import select_device
    from accel.distributed import Communicator, build_context, start_process_group
    from accel.env import detect_launch

    info = detect_launch()
    device = select_device(cpu=True)
    ctx = build_context(info, device)
    group = start_process_group(ctx, info=info, device=device)
    return ctx, Communicator(ctx), group
