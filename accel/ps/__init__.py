"""Parameter-server training: sparse embedding tables on server processes (``accel.ps``).

Start a job with ``accel launch --server_num S --worker_num W train.py`` (one rendezvous for all
S + W processes; on several machines fleetrun's ``--servers``/``--workers`` host lists). The
same script runs everywhere and asks for its role, as with Paddle's ``fleet``::

    from accel import Accelerator, ps

    if ps.is_server():
        ps.run_server()                  # serves until every worker called stop_worker()
    else:
        accelerator = Accelerator()      # the workers alone: num_processes == W
        table = ps.ShardedEmbedding(1_000_000, 16, sparse_optimizer=ps.Adagrad(lr=0.05))
        model = WideAndDeep(table, ...)  # dense layers all-reduced among workers (DDP)
        model, optimizer = accelerator.prepare(model, optimizer)
        ps.checkpoint_with(accelerator)  # save_state/load_state include the servers' shards
        ...train...
        ps.stop_worker()

Outside such a launch the process is the only worker and holds the only server itself, so the
script also runs with plain ``python train.py``.

Example:
    >>> from accel import ps
    >>> ps.is_worker(), ps.worker_num(), ps.server_num()
    (True, 1, 1)
"""

from __future__ import annotations

from typing import Any

from . import _remote, _session
from .checkpoint import checkpoint_with
from .embedding import ShardedEmbedding, ShardedEmbeddingBag
from .optimizers import SGD, Adagrad, Adam, SparseOptimizer
from .partition import initial_weight

__all__ = ["SGD", "Adagrad", "Adam", "ShardedEmbedding", "ShardedEmbeddingBag",
           "SparseOptimizer", "checkpoint_with", "init_server", "init_worker", "initial_weight",
           "is_first_worker", "is_server", "is_worker", "run_server", "server_index",
           "server_num", "server_stats", "stop_worker", "worker_index", "worker_num"]


def is_server() -> bool:
    """Whether this process is a parameter server (it should call :func:`run_server`)."""
    return _session.current().is_server


def is_worker() -> bool:
    """Whether this process trains (also true in a plain one-process run)."""
    return not _session.current().is_server


def is_first_worker() -> bool:
    """Worker 0 (Paddle's ``fleet.is_first_worker()``)."""
    session = _session.current()
    return not session.is_server and session.role.index == 0


def worker_index() -> int:
    """This worker's index in ``0 .. worker_num() - 1`` (its process index among workers)."""
    session = _session.current()
    if session.is_server:
        raise RuntimeError("worker_index() on a parameter server; use server_index()")
    return session.role.index


def server_index() -> int:
    """This server's index in ``0 .. server_num() - 1``."""
    session = _session.current()
    if not session.is_server:
        raise RuntimeError("server_index() on a worker; use worker_index()")
    return session.role.index


def worker_num() -> int:
    return _session.current().role.worker_num


def server_num() -> int:
    return _session.current().role.server_num


def init_server() -> None:
    """Join the job's RPC agent as a server (``run_server`` does it if needed)."""
    session = _session.current()
    if not session.is_server:
        raise RuntimeError("init_server() on a worker; guard it with `if ps.is_server():`")
    session.start_rpc()


def run_server() -> None:
    """Serve the tables until every worker called :func:`stop_worker`, then leave cleanly."""
    init_server()
    session = _session.current()
    assert session.server is not None  # start_rpc made it
    while not session.server.wait_workers(timeout=1.0):
        pass  # a timed wait keeps Ctrl-C working
    session.shutdown()


def init_worker() -> None:
    """Join the job's RPC agent as a worker (building the first table does it if needed)."""
    session = _session.current()
    if session.is_server:
        raise RuntimeError("init_worker() on a server; call run_server() there")
    session.start_rpc()


def stop_worker() -> None:
    """Finish: wait for this worker's pushes (``geo``: push the local changes), tell the
    servers, and leave the RPC agent (it waits until every worker and server leaves)."""
    _session.current().stop_worker()


def server_stats() -> dict[str, Any]:
    """Rows pulled and pushed so far, per table, summed over the servers (for benchmarks)."""
    session = _session.current()
    totals: dict[str, Any] = {}
    for s, future in [(s, session.call(s, _remote.stats)) for s in range(session.role.server_num)]:
        for name, (pulled, pushed) in session.wait(s, future).items():
            old = totals.get(name, (0, 0))
            totals[name] = (old[0] + pulled, old[1] + pushed)
    return totals
