"""``notebook_launcher`` / ``debug_launcher``: run a function in N processes from Jupyter.

Built on torchrun's elastic agent (``torch.distributed.launcher.api.elastic_launch``) with the
``fork`` start method, so functions defined in a notebook cell work without pickling. Each call
uses a fresh rendezvous (a c10d store on a free port), so it can be called again in the same
kernel, also after a failure.

Paddle users: ``accel.spawn`` (``accel.launch.spawning``) is ``paddle.distributed.spawn`` on this
machinery; ``notebook_launcher`` blocks and returns rank 0's return value instead of a context.

Example:
    >>> def train(lr):
    ...     from accel import Accelerator
    ...     accelerator = Accelerator()
    ...     return accelerator.process_index
    >>> notebook_launcher(train, (0.1,), num_processes=2)  # doctest: +SKIP
    0
"""

from __future__ import annotations

import base64
import gc
import logging
import os
import pickle
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._base.warn import warn_user
from ..env import apply, cpu_count, error_file, worker_ranks
from .core import (
    LOOPBACK,
    MULTI_NODE_RUN_ID,
    Rendezvous,
    WorkerSpec,
    accel_extra,
    default_backend,
    default_port,
    default_threads,
    exposed_port_warning,
    extract_failures,
)
from .procs import set_parent_death_signal
from .report import root_failure, user_traceback, write_error_file

__all__ = ["WorkerFailedError", "debug_launcher", "notebook_launcher"]

#: Signals torchelastic takes over in the caller (and does not give back).
_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
_NOISY_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")


class WorkerFailedError(RuntimeError):
    """A worker died without a Python exception (killed, crashed) or its exception was lost."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback; shown as the cause of the re-raised exception."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _worker(function: Callable[..., Any], env: Mapping[str, str], parent: int | None,
            report: Any, *args: Any) -> Any:
    """Runs in each worker: set the environment, call ``function``, record failures.

    ``report``: None, or a multiprocessing queue that gets ``(rank, pid)`` when the worker starts
    (``accel.spawn``'s ``context.processes``).
    """
    apply(env)
    if parent is not None:
        set_parent_death_signal(parent)
    rank = worker_ranks()[0]
    if report is not None and rank.isdigit():
        report.put((int(rank), os.getpid()))
    threads = env.get("OMP_NUM_THREADS")
    torch_module = sys.modules.get("torch")
    if threads and torch_module is not None:  # forked after import: OMP_NUM_THREADS is too late
        torch_module.set_num_threads(int(threads))
    try:
        return function(*args)
    except BaseException as exc:  # noqa: BLE001 - recorded for the caller, then exit 1
        try:
            payload = base64.b64encode(pickle.dumps(exc)).decode()
        except Exception as pickle_error:  # noqa: BLE001 - unpicklable: traceback text only
            payload = f"!{type(pickle_error).__name__}: {pickle_error}"
        extra = {"rank": worker_ranks()[0], "exception": payload}
        write_error_file(exc, path=error_file(), extra=extra, traceback_text=user_traceback(exc,
                                                                                            internal=(__file__,)))
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(1) from None  # SystemExit: torchelastic's @record keeps our error file


def _check_parent(cuda: bool = True, *, who: str = "notebook_launcher") -> None:
    """Refuse to fork from a process whose state the workers cannot inherit safely."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError(
            f"{who}: torch.distributed is already initialised in this process; "
            "call torch.distributed.destroy_process_group() or restart the kernel"
        )
    if not cuda:
        return
    if torch.cuda.is_initialized():
        raise RuntimeError(
            f"{who}: CUDA is already initialised in this process (a cell moved a "
            "tensor or model to the GPU), and forked workers cannot use CUDA after that. "
            "Restart the kernel and call notebook_launcher before any cell touches the GPU; "
            "create models, tensors and the Accelerator inside the launched function."
        )
    module = sys.modules.get("accel.accelerator.facade")
    cls = getattr(module, "Accelerator", None) if module is not None else None
    if isinstance(cls, type) and any(issubclass(type(obj), cls) for obj in gc.get_objects()):
        raise RuntimeError(
            f"{who}: an accel Accelerator already exists in this process; create "
            "the Accelerator inside the function you launch (each worker needs its own). "
            "Delete it (`del accelerator`, and clear IPython's output history with %reset out) "
            f"or restart the kernel, then call {who} again."
        )


def _raise_failure(exc: Any, who: str = "notebook_launcher") -> None:
    failures = extract_failures(exc.failures)
    payloads = {int(rank): accel_extra(failure.error_file_data).get("exception")
                for rank, failure in exc.failures.items()}
    root = root_failure(failures)
    others = "; ".join(f.summary() for f in failures if f is not root)
    where = f"rank {root.rank} (pid {root.pid}, host {root.host})"
    note = f"raised in {who} worker {where}" + \
        (f"; other ranks: {others}" if others else "")
    payload = payloads.get(root.rank)
    original: BaseException | None = None
    if isinstance(payload, str) and not payload.startswith("!"):
        original = pickle.loads(base64.b64decode(payload))  # written by our own worker
    if root.traceback is None or original is None:
        text = root.traceback or root.message
        raise WorkerFailedError(f"worker {where} failed: {text}\n{note}") from None
    if hasattr(original, "add_note"):  # Python >= 3.11; on 3.10 the header below says it
        original.add_note(note)
    header = f"worker {where} raised (its traceback; re-raised below in the caller):\n"
    raise original from RemoteTraceback(header + root.traceback)


def _rendezvous(master_addr: str, *, port: int | None, node_rank: int,
                num_nodes: int, who: str = "notebook_launcher") -> Rendezvous:
    backend = default_backend(num_nodes)  # never a single-node static: no free port needed
    chosen = port or default_port(backend, num_nodes, free_port=lambda: 0)
    if num_nodes > 1:
        warn_user(f"{who}: {exposed_port_warning(master_addr, chosen)}")
    run_id = MULTI_NODE_RUN_ID if num_nodes > 1 else uuid.uuid4().hex
    return Rendezvous(backend=backend, host=master_addr, port=chosen, run_id=run_id,
                      num_nodes=num_nodes, node_rank=node_rank)


def _launch(function: Callable[..., Any], *, args: Sequence[Any], nproc: int, spec: WorkerSpec,
            master_addr: str, port: int | None, node_rank: int, num_nodes: int,
            max_restarts: int, monitor_interval: float, start_method: str = "fork",
            who: str = "notebook_launcher", report: Any = None) -> dict[int, Any]:
    """Run the workers with torchrun's agent in this thread; their return values by rank."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if start_method == "fork":
        # A failed earlier launch leaves cyclic garbage that holds torchelastic's objects (its
        # store); collected in a forked worker instead of here, it kills the worker (SIGSEGV).
        gc.collect()
    rdzv = _rendezvous(master_addr, port=port, node_rank=node_rank, num_nodes=num_nodes, who=who)
    config = LaunchConfig(nproc_per_node=nproc, role="notebook", max_restarts=max_restarts,
                          monitor_interval=monitor_interval, start_method=start_method,
                          **rdzv.launch_config())
    main_thread = threading.current_thread() is threading.main_thread()
    parent = os.getpid() if main_thread else None  # PDEATHSIG follows the forking thread
    saved = {name: signal.getsignal(getattr(signal, name)) for name in _AGENT_SIGNALS
             if hasattr(signal, name)} if main_thread else {}
    # The agent logs every failed worker at ERROR level; the re-raised exception says it all.
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(config, _worker)(function, spec.environment(), parent, report,
                                                  *args)
    except ChildFailedError as exc:
        _raise_failure(exc, who)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        for name, handler in saved.items():  # the agent replaced the kernel's handlers
            if handler is not None:
                signal.signal(getattr(signal, name), handler)
    return dict(results)


def _threads(nproc: int) -> int:
    return default_threads(cpu_count(), nproc)


def notebook_launcher(
    function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int | None = None,
    mixed_precision: str = "no", use_port: int | None = None, master_addr: str = "127.0.0.1",
    node_rank: int = 0, num_nodes: int = 1, max_restarts: int = 0,
    monitor_interval: float = 0.1, gpu_ids: str | Sequence[int] | None = None,
) -> Any:
    """Run ``function(*args)`` in ``num_processes`` processes per node; return rank 0's result.

    Args:
        function: called in every worker (an ``Accelerator()`` created inside it joins the job).
        args: positional arguments for ``function``.
        num_processes: processes on this node; default one per visible GPU, or 1 without GPUs.
            On a machine without GPUs the workers are CPU processes over gloo.
        mixed_precision: ``no``, ``fp16`` or ``bf16`` (``ACCEL_MIXED_PRECISION`` in workers).
        use_port: rendezvous port; default a free port on one node, 29500 on several.
        master_addr, node_rank, num_nodes: multi-node jobs (static rendezvous).
        max_restarts, monitor_interval: as torchrun's.
        gpu_ids: GPUs to use, e.g. ``"0,1"`` (Paddle's ``selected_gpus``).

    Returns:
        What ``function`` returned on rank 0 (``None`` on nodes that do not host rank 0).

    Raises:
        The worker's exception (its traceback attached as the cause), ``WorkerFailedError``
        when a worker died without one, ``RuntimeError`` if CUDA is already initialised here or
        an ``Accelerator`` already exists in this process, ``ValueError`` for bad arguments.
    """
    from ..config.settings import parse_mixed_precision
    from ..device.cuda import CUDADevice

    if not callable(function):
        raise TypeError(f"notebook_launcher() needs a function to run in every process, got "
                        f"{type(function).__name__} {function!r}")
    if num_processes is not None and (isinstance(num_processes, bool)
                                      or not isinstance(num_processes, int)):
        raise TypeError(f"num_processes must be an int >= 1, got {num_processes!r}")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    _check_parent()
    precision = parse_mixed_precision(mixed_precision).value
    ids = None if gpu_ids is None else (
        gpu_ids if isinstance(gpu_ids, str) else ",".join(str(i) for i in gpu_ids))
    gpus = CUDADevice.count()
    pool = len(ids.split(",")) if ids else gpus
    nproc = num_processes if num_processes is not None else max(pool, 1)
    if nproc < 1:
        raise ValueError(f"num_processes must be >= 1, got {nproc}")
    if gpus and nproc > pool:
        raise ValueError(f"num_processes={nproc} but only {pool} GPU(s) are visible; pass "
                         f"num_processes={pool} or fewer (or use debug_launcher for CPU runs)")
    spec = WorkerSpec(device="cuda" if gpus else "cpu", num_threads=_threads(nproc),
                      mixed_precision=precision if precision != "no" else None,
                      cuda_visible_devices=ids or None)
    return _launch(function, args=args, nproc=nproc, spec=spec, master_addr=master_addr,
                   port=use_port,
                   node_rank=node_rank, num_nodes=num_nodes, max_restarts=max_restarts,
                   monitor_interval=monitor_interval).get(0)


def debug_launcher(function: Callable[..., Any], args: Sequence[Any] = (),
                   num_processes: int = 2) -> Any:
    """Run ``function(*args)`` in ``num_processes`` CPU processes (gloo), for tests.

    Example:
        >>> debug_launcher(lambda: 1, num_processes=2)  # doctest: +SKIP
        1
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    _check_parent(cuda=False)  # the workers are CPU-only: CUDA state in the parent is harmless
    spec = WorkerSpec(device="cpu", num_threads=_threads(num_processes),
                      cuda_visible_devices="")  # hidden: the workers are CPU processes
    return _launch(function, args=args, nproc=num_processes, spec=spec, master_addr=LOOPBACK,
                   port=None,
                   node_rank=0, num_nodes=1, max_restarts=0, monitor_interval=0.1).get(0)
