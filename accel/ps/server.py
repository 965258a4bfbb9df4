"""What a parameter server holds: one shard per table, each with its own lock.

A :class:`Shard` is the rows of one table that this server owns (see
:class:`~accel.ps.partition.Partition`), their sparse-optimizer state, and the bookkeeping of
the table's mode:

- ``sync``: the ``n``-th gradient push of every worker forms round ``n``; when the last worker's
  push arrives the round's gradients are summed row by row, divided by the number of workers
  (each worker pushes the gradient of its own mean loss, as DDP averages dense gradients: the
  result is the gradient of the mean loss over the whole global batch) and applied once; only
  then are the round's pushes answered, so no worker pulls before every update is in.
- ``async``: each push is applied on arrival (divided by the number of workers, so that one
  round of pushes moves the table as far as a sync step does) and answered at once.
- ``geo``: workers train rows locally and push deltas; the server adds ``delta / workers``.

Nothing here knows about RPC: :mod:`accel.ps._remote` calls it, and a process without servers
(``python train.py``) uses the same shards in process.

Example:
    >>> import torch
    >>> from accel.ps.optimizers import SGD
    >>> cfg = TableConfig(name="t", num_embeddings=6, dim=2, optimizer=SGD(lr=1.0).config(),
    ...                   partition="hash", mode="sync", seed=0, init_scale=0.0, workers=2)
    >>> shard = Shard(cfg, server=0, servers=1)
    >>> _ = shard.push(0, seq=0, ids=torch.tensor([1]), grads=torch.ones(1, 2))
    >>> done = shard.push(1, seq=0, ids=torch.tensor([1]), grads=torch.ones(1, 2) * 3)
    >>> shard.pull(torch.tensor([1])).tolist()
    [[-2.0, -2.0]]
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .optimizers import SparseOptimizer, optimizer_from_config
from .partition import Partition, shard_initial

__all__ = ["MODES", "ServerState", "Shard", "TableConfig", "out_of_range"]

MODES = ("sync", "async", "geo")


@dataclass(frozen=True, kw_only=True, slots=True)
class TableConfig:
    """Everything a server needs to create its shard of a table (equal on every worker)."""

    name: str
    num_embeddings: int
    dim: int
    optimizer: dict[str, Any]
    partition: str
    mode: str
    seed: int
    init_scale: float
    workers: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def out_of_range(ids: torch.Tensor, num_embeddings: int, table: str) -> IndexError | None:
    """The error for ids outside ``[0, num_embeddings)``, naming the first one; else None."""
    if ids.numel() == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < num_embeddings:
        return None
    bad = low if low < 0 else high
    return IndexError(f"embedding id {bad} is out of range for table {table!r} with "
                      f"{num_embeddings} rows (valid ids: 0..{num_embeddings - 1}); check the "
                      "feature hashing / vocabulary size of the batch")


@dataclass(kw_only=True, slots=True)
class _Round:
    parts: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    futures: list[torch.futures.Future[None]] = field(default_factory=list)


class Shard:
    """This server's rows of one table, their optimizer state, and the mode's bookkeeping."""

    def __init__(self, config: TableConfig, server: int, servers: int) -> None:
        self.config = config
        self.server = server
        self.partition = Partition(num_embeddings=config.num_embeddings, servers=servers,
                                   kind=config.partition)
        self.optimizer: SparseOptimizer = optimizer_from_config(config.optimizer)
        self.weight = shard_initial(self.partition, server=server, dim=config.dim, seed=config.seed,
                                    scale=config.init_scale)
        self.state = self.optimizer.init_state(len(self.weight), config.dim)
        self.lock = threading.Lock()
        self._rounds: dict[int, _Round] = {}
        self.pulled_rows = 0
        self.pushed_rows = 0

    def _local(self, ids: torch.Tensor) -> torch.Tensor:
        error = out_of_range(ids, self.config.num_embeddings, self.config.name)
        if error is not None:
            raise error
        if ids.numel() and bool((self.partition.owner(ids) != self.server).any()):
            raise ValueError(f"table {self.config.name!r}: ids sent to server {self.server} "
                             "that another server owns (workers and servers disagree on the "
                             "partition; restart the job)")
        return self.partition.local(ids)

    def pull(self, ids: torch.Tensor) -> torch.Tensor:
        """The current rows of ``ids`` (a copy)."""
        local = self._local(ids)
        with self.lock:
            self.pulled_rows += len(local)
            return self.weight[local].clone()

    def _apply(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        ids = torch.cat([p[0] for p in parts])
        grads = torch.cat([p[1] for p in parts])
        if ids.numel() == 0:
            return
        rows, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(len(rows), grads.shape[1], dtype=grads.dtype)
        summed.index_add_(0, inverse, grads)
        self.optimizer.apply(self.weight, self.state, rows, summed / self.config.workers)
        self.pushed_rows += len(ids)

    def push(self, worker: int, *, seq: int, ids: torch.Tensor, grads: torch.Tensor
             ) -> torch.futures.Future[None]:
        """A worker's gradient rows; the future completes once they are applied (``sync``:
        once every worker's push of round ``seq`` is applied)."""
        local = self._local(ids)
        future: torch.futures.Future[None] = torch.futures.Future()
        done: list[torch.futures.Future[None]] = [future]
        with self.lock:
            if self.config.mode != "sync":
                self._apply([(local, grads)])
            else:
                round_ = self._rounds.setdefault(seq, _Round())
                if worker in round_.parts:
                    raise RuntimeError(f"table {self.config.name!r}: worker {worker} pushed "
                                       f"round {seq} twice")
                round_.parts[worker] = (local, grads)
                round_.futures.append(future)
                done = []
                if len(round_.parts) == self.config.workers:
                    del self._rounds[seq]
                    self._apply([round_.parts[w] for w in sorted(round_.parts)])
                    done = round_.futures
        for fut in done:
            fut.set_result(None)
        return future

    def add_delta(self, ids: torch.Tensor, delta: torch.Tensor) -> None:
        """``geo``: add a worker's locally trained change, shared out over the workers."""
        local = self._local(ids)
        with self.lock:
            self.weight.index_add_(0, local, delta, alpha=1.0 / self.config.workers)
            self.pushed_rows += len(local)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Global ids, rows and optimizer state, for a checkpoint file."""
        with self.lock:
            out = {"ids": self.partition.global_ids(self.server), "weight": self.weight.clone()}
            out.update({f"state.{k}": v.clone() for k, v in self.state.items()})
        return out

    def restore(self, files: list[dict[str, torch.Tensor]], where: str) -> None:
        """Take this server's rows (and state) from every shard file of the table: files
        written by any number of servers, with any partition (re-partitioning)."""
        seen = torch.zeros(len(self.weight), dtype=torch.bool)
        with self.lock:
            for tensors in files:
                ids = tensors["ids"]
                mine = self.partition.owner(ids) == self.server
                local = self.partition.local(ids[mine])
                if tensors["weight"].shape[1:] != self.weight.shape[1:]:
                    raise ValueError(f"{where}: rows of width {tensors['weight'].shape[1]}, but "
                                     f"table {self.config.name!r} has dim {self.config.dim}")
                self.weight[local] = tensors["weight"][mine]
                for key, value in self.state.items():
                    if f"state.{key}" not in tensors:
                        raise ValueError(f"{where}: no optimizer state {key!r} for table "
                                         f"{self.config.name!r} (saved with another sparse "
                                         "optimizer?); use the optimizer it was saved with")
                    value[local] = tensors[f"state.{key}"][mine]
                seen[local] = True
            self._rounds.clear()
        if not bool(seen.all()):
            missing = self.partition.global_ids(self.server)[~seen][:5].tolist()
            raise ValueError(f"{where}: the checkpoint lacks rows of table "
                             f"{self.config.name!r} (e.g. ids {missing}); it is incomplete")


class ServerState:
    """All shards of one server process, and which workers have finished."""

    def __init__(self, server: int, servers: int, workers: int) -> None:
        self.server, self.servers, self.workers = server, servers, workers
        self.shards: dict[str, Shard] = {}
        self._lock = threading.Lock()
        self._done: set[int] = set()
        self._all_done = threading.Condition(self._lock)

    def create(self, config: TableConfig) -> None:
        """Create the shard of a table; a second worker asking for the same table is a no-op,
        one asking for a different table under the same name is an error."""
        with self._lock:
            existing = self.shards.get(config.name)
            if existing is None:
                self.shards[config.name] = Shard(config, self.server, self.servers)
            elif existing.config != config:
                raise ValueError(f"table {config.name!r} was created with {existing.config} "
                                 f"but a worker asks for {config}; build the same tables (same "
                                 "arguments, same order) on every worker, or name them")

    def shard(self, name: str) -> Shard:
        try:
            return self.shards[name]
        except KeyError:
            raise KeyError(f"server {self.server} has no table {name!r}; create the "
                           "ShardedEmbedding on every worker before using it") from None

    def worker_done(self, worker: int) -> None:
        with self._all_done:
            self._done.add(worker)
            self._all_done.notify_all()

    def wait_workers(self, timeout: float | None = None) -> bool:
        """Block until every worker called ``stop_worker()``; False on timeout."""
        with self._all_done:
            return self._all_done.wait_for(lambda: len(self._done) >= self.workers, timeout)
