"""The functions workers run on parameter servers (through ``rpc_async``, or directly in a
process that holds its own server). Each finds this server's shards through the session.

Tensors travel as RPC arguments (TensorPipe); checkpoint files are safetensors written by the
servers themselves into the checkpoint's temporary directory (:mod:`accel.ps.checkpoint`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.distributed.rpc import functions as rpc_functions

from ..checkpoint.storage import load, save
from .server import ServerState, TableConfig

__all__ = ["add_delta", "create_table", "load_shards", "pull", "push", "save_shards", "serve",
           "shard_file", "stats", "worker_done"]


class _Served:
    """The shards this process serves: set once by its session (``accel.ps._session``, which
    explains why such a per-process slot exists); RPC calls from workers find them here."""

    state: ServerState | None = None


def serve(state: ServerState) -> None:
    """Make ``state`` the shards the functions below work on (called by the session)."""
    _Served.state = state


def _server() -> ServerState:
    if _Served.state is None:
        raise RuntimeError("this process is not a parameter server (it holds no shards)")
    return _Served.state


def create_table(config_json: str) -> None:
    _server().create(TableConfig(**json.loads(config_json)))


def pull(table: str, ids: torch.Tensor) -> torch.Tensor:
    return _server().shard(table).pull(ids)


@rpc_functions.async_execution  # type: ignore[untyped-decorator]
def push(table: str, *, worker: int, seq: int, ids: torch.Tensor, grads: torch.Tensor
         ) -> torch.futures.Future[None]:
    return _server().shard(table).push(worker, seq=seq, ids=ids, grads=grads)


def add_delta(table: str, ids: torch.Tensor, delta: torch.Tensor) -> None:
    _server().shard(table).add_delta(ids, delta)


def worker_done(worker: int) -> None:
    _server().worker_done(worker)


def stats() -> dict[str, tuple[int, int]]:
    """(rows pulled, rows pushed) per table since the start."""
    return {name: (s.pulled_rows, s.pushed_rows) for name, s in _server().shards.items()}


def shard_file(root: str | Path, *, table: str, server: int, servers: int) -> Path:
    """Where server ``server`` of ``servers`` keeps its rows of ``table`` in a checkpoint."""
    return Path(root) / "ps" / table / f"shard-{server:05d}-of-{servers:05d}.safetensors"


def save_shards(directory: str) -> list[str]:
    """Write every table's shard of this server into ``directory``; returns the paths."""
    state = _server()
    written = []
    for name, shard in sorted(state.shards.items()):
        path = shard_file(directory, table=name, server=state.server, servers=state.servers)
        save(shard.tensors(), path, metadata={"accel_ps_table": shard.config.to_json()})
        written.append(str(path))
    return written


def load_shards(directory: str) -> None:
    """Restore every table of this server from the shard files in ``directory`` (written by
    any number of servers: each server takes the rows it owns now)."""
    state = _server()
    for name, shard in sorted(state.shards.items()):
        folder = Path(directory) / "ps" / name
        files = sorted(folder.glob("shard-*.safetensors")) if folder.is_dir() else []
        if not files:
            raise FileNotFoundError(f"checkpoint {directory} has no shards of parameter-server "
                                    f"table {name!r} (looked in {folder}); load a checkpoint "
                                    "saved with accel.ps.checkpoint_with(accelerator)")
        shard.restore([load(f) for f in files], str(folder))
