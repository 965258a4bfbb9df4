"""The parameter-server session of this process: its role, the RPC agent, its tables.

``torch.distributed.rpc`` is once per process (one agent, one name), so ``accel.ps`` keeps one
:class:`Session` per process in the holder below, like ``accel.horovod``'s session: the one
deliberate exception to "no module-level state" (DESIGN.md §3.2), a view over what already is
once per process (the launcher's roles, the RPC agent). It is created on first use from the
environment ``accel launch --server_num/--worker_num`` sets (:func:`accel.env.ps_role`).

Outside such a launch (``python train.py``) the process is the only worker and holds the only
server itself (``local``): the same tables, optimizers and checkpoints, without RPC.

RPC spans servers and workers (TensorPipe, rendezvous through torchrun's store under RPC's own
key prefix); the default process group spans the workers only (``accel.env.detect_launch``
gives a worker its worker index and the worker count), so dense parameters are all-reduced
among workers by an ``Accelerator`` as usual and servers never join a collective.
"""

from __future__ import annotations

import atexit
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..env import PsRole, ps_role, read_settings
from . import _remote
from .server import ServerState

__all__ = ["Flushable", "Session", "current", "server_name"]

#: RPC timeout when ACCEL_TIMEOUT is unset: a sync push waits for the slowest worker's step.
_DEFAULT_TIMEOUT = 1800.0


class Flushable(Protocol):
    """A table on a worker: waits for its pushes in flight, pushes (``geo``) or drops what it
    trained locally."""

    def flush(self) -> None: ...

    def reset_cache(self) -> None: ...

    def push_deltas(self) -> None: ...


def server_name(index: int) -> str:
    return f"server{index}"


def _worker_name(index: int) -> str:
    return f"worker{index}"


@dataclass(kw_only=True, slots=True)
class Session:
    """This process's place in the job and what it set up.

    ``local``: no launch roles; the process is worker 0 of 1 and holds server 0 of 1 itself.
    """

    role: PsRole
    local: bool
    server: ServerState | None = None
    rpc_started: bool = False
    stopped: bool = False
    table_count: int = 0
    tables: list[weakref.ref[Any]] = field(default_factory=list)

    @property
    def is_server(self) -> bool:
        return self.role.is_server

    def start_rpc(self) -> None:
        """Join the job's RPC agent (every server and worker must; it waits for all of them)."""
        if self.local or self.rpc_started:
            return
        if self.stopped:
            raise RuntimeError("this worker already called accel.ps.stop_worker(); the "
                               "parameter servers are gone for it")
        from torch.distributed import rpc

        timeout = read_settings().timeout or _DEFAULT_TIMEOUT
        options = rpc.TensorPipeRpcBackendOptions(init_method="env://", rpc_timeout=timeout)
        name = server_name(self.role.index) if self.is_server else _worker_name(self.role.index)
        if self.is_server:
            self.server = ServerState(self.role.index, self.role.server_num,
                                      self.role.worker_num)
            _remote.serve(self.server)
        with warnings.catch_warnings():
            # torch's RPC start-up uses its own gloo backend object as a group (its warning)
            warnings.filterwarnings("ignore", message="You are using a Backend",
                                    category=UserWarning)
            rpc.init_rpc(name, rank=self.role.rank,  # type: ignore[no-untyped-call]
                         world_size=self.role.world_size, rpc_backend_options=options)
        self.rpc_started = True
        if not self.is_server:  # servers wait for every worker: none may leave without a word
            atexit.register(self._stop_at_exit)

    def call(self, server: int, fn: Callable[..., Any], *args: Any,
             **kwargs: Any) -> torch.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` (a function of :mod:`accel.ps._remote`) on ``server``."""
        if self.local:
            result = fn(*args, **kwargs)
            if isinstance(result, torch.futures.Future):
                return result
            done: torch.futures.Future[Any] = torch.futures.Future()
            done.set_result(result)
            return done
        self.start_rpc()
        from torch.distributed import rpc

        future: torch.futures.Future[Any] = rpc.rpc_async(server_name(server), fn, args=args,
                                                           kwargs=kwargs)
        return future

    def wait(self, server: int, future: torch.futures.Future[Any]) -> Any:
        """``future.wait()``; a lost connection to ``server`` raises a ConnectionError that
        names it (the launcher's report then ranks it after the server's own failure)."""
        try:
            return future.wait()
        except RuntimeError as exc:
            text = str(exc)
            if "tensorpipe" not in text.lower() and "eof" not in text:
                raise
            raise ConnectionError(
                f"parameter server {server} ({server_name(server)}) went away: connection "
                f"closed by peer ({text.strip().splitlines()[0]}); the job cannot go on "
                "without its rows: see the server's failure in the launcher's report") from exc

    def live_tables(self) -> list[Flushable]:
        alive = [t for ref in self.tables if (t := ref()) is not None]
        self.tables = [weakref.ref(t) for t in alive]
        return alive

    def stop_worker(self) -> None:
        """Flush every table (``geo``: push local changes), tell the servers that this worker
        is done, leave the RPC agent. Idempotent; a no-op on a server."""
        if self.is_server or self.stopped:
            return
        for table in self.live_tables():
            table.flush()
            table.push_deltas()
        if not self.local:
            self.start_rpc()
            calls = [(s, self.call(s, _remote.worker_done, self.role.index))
                     for s in range(self.role.server_num)]
            for s, future in calls:
                self.wait(s, future)
        self.shutdown()

    def _stop_at_exit(self) -> None:
        if not self.stopped:
            warnings.warn("the script ended without accel.ps.stop_worker(): stopping this "
                          "worker now so that the servers can finish; call ps.stop_worker() "
                          "at the end of training", stacklevel=1)
            self.stop_worker()

    def shutdown(self) -> None:
        """Leave the RPC agent gracefully: waits until every server and worker leaves it."""
        if self.rpc_started:
            from torch.distributed import rpc

            rpc.shutdown(graceful=True)
            self.rpc_started = False
        self.stopped = True


class _Holder:
    """The one per-process slot (see the module docstring for why it exists)."""

    session: Session | None = None


def current() -> Session:
    """This process's session, created from the launcher's environment on first use."""
    if _Holder.session is None:
        role = ps_role()
        local = role is None
        if role is None:
            role = PsRole(role="worker", index=0, server_num=1, worker_num=1, rank=0, world_size=1,
                          local_index=0, local_count=1, machine=0)
        session = Session(role=role, local=local)
        if local:
            session.server = ServerState(0, 1, 1)
            _remote.serve(session.server)
        _Holder.session = session
    return _Holder.session
