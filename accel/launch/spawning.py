"""``accel.spawn``: PaddlePaddle's ``paddle.distributed.spawn`` on torchrun's agent.

``spawn(func, args, nprocs, join, daemon, **options)`` starts ``nprocs`` processes that each
call ``func(*args)`` (no process index is passed, as in Paddle: an ``Accelerator()`` or
``accel.horovod.init()`` inside ``func`` finds its rank). It is the notebook launcher's machinery
(``accel.launch.notebook``) with Paddle's signature: one c10d rendezvous per call, the
workers' environment from the launch core, and a worker's exception re-raised in the caller
naming its rank.

Options (Paddle's names):

- ``start_method``: ``"spawn"`` (Paddle's default; ``func`` must be importable, i.e. defined at
  the top level of a module), ``"fork"`` (also functions of a notebook cell or a lambda) or
  ``"forkserver"``;
- ``gpus`` (or ``selected_devices``): GPU indices such as ``"0,1"``; ``nprocs`` must match;
- ``backend``: ``"auto"`` (GPUs if visible, else CPU), ``"nccl"`` (GPU processes) or
  ``"gloo"`` (CPU processes);
- ``ips``: the machines, e.g. ``"10.0.0.1,10.0.0.2"``: call ``spawn`` on every machine; the
  first is where rank 0 and the rendezvous live, this machine's rank comes from its address
  (as ``accel launch --ips``); ``started_port``: the rendezvous port (default 29500 on several
  machines);
- ``print_config``: print the resolved layout.

``nprocs=-1`` means one process per visible GPU (per ``gpus`` when given). Without GPUs it
means 1 process, where Paddle starts one per CPU core: gloo processes that each default to
all cores' worth of threads only compete, so pass ``nprocs=N`` for N CPU processes.

Example:
    >>> import accel
    >>> def train(lr):
    ...     from accel import Accelerator
    ...     return Accelerator().process_index
    >>> context = accel.spawn(train, (0.1,), nprocs=2, start_method="fork")  # doctest: +SKIP
    >>> context.results  # doctest: +SKIP
    {0: 0, 1: 1}
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._base.warn import warn_user
from ..env import cpu_count
from .core import LOOPBACK, WorkerSpec, default_threads, is_local_address
from .notebook import _check_parent, _launch

__all__ = ["SpawnContext", "WorkerProcess", "spawn"]

_START_METHODS = ("spawn", "fork", "forkserver")
_BACKENDS = {"auto": None, "nccl": "cuda", "gloo": "cpu"}
_OPTIONS = ("start_method", "gpus", "selected_devices", "backend", "ips", "started_port",
            "print_config")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerProcess:
    """A started worker: its global rank and process id (on this machine)."""

    rank: int
    pid: int

    def is_alive(self) -> bool:
        """Whether the process still runs (a finished worker is reaped by the agent)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pid reused by another user's process: ours is gone
            return False
        return _state(self.pid) not in ("Z", "X")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"  # no /proc (macOS): alive as far as kill(0) can tell


class SpawnContext:
    """What ``spawn`` returns (Paddle's ``MultiprocessContext``): the running job.

    Attributes:
        results: each rank's return value (ranks of this machine), once the job has finished.
    """

    def __init__(self, report: Any, daemon: bool) -> None:
        self._report = report
        self._seen: dict[int, WorkerProcess] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.results: dict[int, Any] = {}
        self._daemon = daemon

    def _run(self, launch: Callable[[], dict[int, Any]]) -> None:
        try:
            self.results = launch()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller by join()
            self._error = exc

    def _start(self, launch: Callable[[], dict[int, Any]]) -> None:
        self._thread = threading.Thread(target=self._run, args=(launch,), daemon=self._daemon,
                                        name="accel.spawn agent")
        if self._daemon:  # as daemonic processes: the workers end with this process
            atexit.register(self._terminate)
        self._thread.start()

    @property
    def processes(self) -> list[WorkerProcess]:
        """The workers started so far on this machine, by rank."""
        while self._report is not None and not self._report.empty():
            rank, pid = self._report.get()
            self._seen[rank] = WorkerProcess(rank=rank, pid=pid)
        return [self._seen[rank] for rank in sorted(self._seen)]

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the job ends); True when it has ended.

        Raises:
            The exception of the worker that failed first (naming its rank), or
            ``WorkerFailedError`` when a worker died without one; the other workers have been
            stopped by then.
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if self._error is not None:
            raise self._error
        return True

    def _terminate(self) -> None:
        for process in self.processes:
            if process.is_alive():
                try:
                    os.kill(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue


def _gpu_list(options: Mapping[str, Any]) -> str | None:
    values = {name: options[name] for name in ("gpus", "selected_devices")
              if options.get(name) is not None}
    texts = {name: value if isinstance(value, str) else ",".join(str(i) for i in value)
             for name, value in values.items()}
    if len(set(texts.values())) > 1:
        raise ValueError(f"spawn(): gpus={texts['gpus']!r} and selected_devices="
                         f"{texts['selected_devices']!r} contradict each other; pass only gpus")
    text = next(iter(texts.values()), None)
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(item.isdigit() for item in items):
        raise ValueError(f"spawn(): gpus={text!r} is not a list of GPU indices such as '0,1'")
    return ",".join(items)


def _check_options(options: Mapping[str, Any]) -> tuple[str, str | None]:
    """(start method, device or None for auto) after refusing unknown options."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        xpu = " (accel has no XPU support; GPUs are chosen with gpus=)" if "xpus" in unknown \
            else ""
        raise ValueError(f"spawn(): unsupported option(s) {', '.join(unknown)}{xpu}; supported: "
                         f"{', '.join(_OPTIONS)}")
    method = str(options.get("start_method", "spawn"))
    if method not in _START_METHODS:
        raise ValueError(f"spawn(): start_method={method!r}; expected one of "
                         f"{', '.join(_START_METHODS)}")
    backend = str(options.get("backend", "auto"))
    if backend not in _BACKENDS:
        raise ValueError(f"spawn(): backend={backend!r}; expected auto, nccl (GPU processes) or "
                         "gloo (CPU processes)")
    return method, _BACKENDS[backend]


def _device_and_nprocs(nprocs: int, device: str | None, gpus: str | None) -> tuple[str, int]:
    from ..device.cuda import CUDADevice

    visible = CUDADevice.count()
    device = device or ("cuda" if visible else "cpu")
    if device == "cuda" and not visible:
        raise ValueError("spawn(): backend='nccl' needs GPUs but none is visible; check "
                         "CUDA_VISIBLE_DEVICES, or pass backend='gloo' for CPU processes")
    if device == "cpu":
        if gpus is not None:
            warn_user(f"spawn(): gpus={gpus!r} is ignored: the processes run on the CPU "
                      "(no GPU visible, or backend='gloo')")
        return device, 1 if nprocs == -1 else nprocs
    pool = len(gpus.split(",")) if gpus else visible
    if gpus and max(int(i) for i in gpus.split(",")) >= visible:
        raise ValueError(f"spawn(): gpus={gpus!r} names a GPU that is not visible (indices "
                         f"0..{visible - 1}); check CUDA_VISIBLE_DEVICES")
    count = pool if nprocs == -1 else nprocs
    if gpus and count != pool:
        raise ValueError(f"spawn(): nprocs={nprocs} but gpus={gpus!r} lists {pool} GPU(s); "
                         f"pass nprocs={pool} (or -1), one process per GPU")
    if count > pool:
        raise ValueError(f"spawn(): nprocs={nprocs} but only {pool} GPU(s) are visible; pass "
                         f"nprocs={pool} or fewer, or backend='gloo' for CPU processes")
    return device, count


def _machines(ips: object) -> tuple[int, int, str]:
    """(machines, this machine's rank, address of machine 0) from Paddle's ``ips``."""
    listed = [ip.strip() for ip in str(ips or LOOPBACK).split(",") if ip.strip()]
    if len(listed) <= 1:
        return 1, 0, LOOPBACK
    local = [index for index, ip in enumerate(listed) if is_local_address(ip)]
    if not local:
        raise ValueError(f"spawn(): ips={ips!r}: none of these addresses belongs to this "
                         "machine; list this machine's address (as the other machines reach it)")
    return len(listed), local[0], listed[0]


def _checked(func: Callable[..., Any], *, args: Iterable[Any], nprocs: int,
             method: str) -> tuple[Any, ...]:
    if not callable(func):
        raise TypeError(f"spawn() needs a function to run in every process, got "
                        f"{type(func).__name__} {func!r}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs == 0 or nprocs < -1:
        raise ValueError(f"spawn(): nprocs must be -1 (all devices) or >= 1, got {nprocs!r}")
    if method != "fork":
        try:
            pickle.dumps(func)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(f"spawn(): start_method={method!r} sends func to new interpreters, "
                            f"but {func!r} cannot be pickled ({exc}); define it at the top "
                            "level of a module, or pass start_method='fork'") from None
    return tuple(args)


def spawn(func: Callable[..., Any], args: Iterable[Any] = (), nprocs: int = -1,
          join: bool = True, daemon: bool = False, **options: Any) -> SpawnContext:
    """Start ``nprocs`` processes that each run ``func(*args)`` (Paddle's ``spawn``).

    Args:
        func: called in every process; with ``start_method="spawn"`` (the default) it must be
            defined at the top level of a module.
        args: positional arguments of ``func``.
        nprocs: processes on this machine; -1: one per visible GPU (or per ``gpus``), 1
            without GPUs.
        join: wait for the processes to finish (and re-raise a failure) before returning.
        daemon: with ``join=False``, stop the workers when this process exits instead of
            waiting for them.
        **options: ``start_method``, ``gpus``/``selected_devices``, ``backend``, ``ips``,
            ``started_port``, ``print_config`` (see the module's documentation).

    Returns:
        A ``SpawnContext``: ``join(timeout=None)``, ``processes`` and, once finished,
        ``results`` (each rank's return value).

    Raises:
        The exception of the first worker that failed (with a note naming its rank and the
        worker's traceback as the cause), ``WorkerFailedError`` for a worker that died without
        one, ``ValueError``/``TypeError`` for bad arguments or options.
    """
    method, device = _check_options(options)
    arguments = _checked(func, args=args, nprocs=nprocs, method=method)
    device, count = _device_and_nprocs(nprocs, device, _gpu_list(options))
    machines, node_rank, master = _machines(options.get("ips"))
    gpus = _gpu_list(options) if device == "cuda" else None
    if method == "fork":
        _check_parent(cuda=device == "cuda", who="spawn")
    spec = WorkerSpec(device=device, num_threads=default_threads(cpu_count(), count),
                      cuda_visible_devices=gpus)
    if options.get("print_config"):
        print(f"accel.spawn: {count} {device} process(es) on machine {node_rank} of {machines} "
              f"(rendezvous {master}), start_method={method}, gpus={gpus or 'all'}",
              file=sys.stderr, flush=True)
    report = multiprocessing.get_context(method).SimpleQueue()
    context = SpawnContext(report, daemon)

    def launch() -> dict[int, Any]:
        return _launch(func, args=arguments, nproc=count, spec=spec, master_addr=master,
                       port=options.get("started_port"), node_rank=node_rank,
                       num_nodes=machines, max_restarts=0, monitor_interval=0.1,
                       start_method=method, who="spawn", report=report)

    if join:
        context._run(launch)
        context.join()
    else:
        context._start(launch)
    return context
