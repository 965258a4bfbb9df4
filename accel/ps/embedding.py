"""``ShardedEmbedding`` and ``ShardedEmbeddingBag``: embedding tables held by parameter servers.

The module holds no weight. Its forward pulls the distinct ids of the batch from their servers
(one request per server, all in flight together) and looks the batch up in those rows; its
backward pushes one gradient row per distinct id to the servers, which apply the sparse
optimizer. The mode says when a pushed gradient must be in before the next pull:

- ``"sync"``: before this worker's next pull, every worker's gradient of the step is applied
  (the servers answer a round of pushes once all workers pushed it): a run equals one process
  training on the whole global batch. Every worker must run the same number of steps.
- ``"async"``: applied on arrival; a worker waits only when more than ``max_staleness`` of its
  own steps are still in flight (None: never).
- ``"geo"``: rows are trained locally by the worker with the same optimizer rule, and every
  ``k_steps`` steps the changes (deltas) are pushed and the local rows dropped, so the next
  step pulls what every worker contributed (the server adds ``delta / workers``: the workers'
  rows are averaged, as in local SGD). The local optimizer state (Adagrad's sums, Adam's
  moments) restarts at each exchange, so ``ps.SGD`` is the natural rule here (Paddle's
  GEO-SGD).

Each backward pushes: under gradient accumulation every micro-batch's row gradients are applied
(the dense parameters wait for the accumulation boundary as usual). In ``sync`` mode every
worker must run the same number of backward passes through a table.

Example (one process: the process holds the only server itself):
    >>> import torch
    >>> from accel import ps
    >>> table = ps.ShardedEmbedding(100, 4, sparse_optimizer=ps.SGD(lr=0.1), name="doc")
    >>> out = table(torch.tensor([[1, 2], [2, 99]]))
    >>> out.shape
    torch.Size([2, 2, 4])
    >>> out.sum().backward()
    >>> table.pull(torch.tensor([3])).shape
    torch.Size([1, 4])
"""

from __future__ import annotations

import math
import weakref
import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import _remote, _session
from .optimizers import SGD, SparseOptimizer
from .partition import Partition
from .server import MODES, TableConfig, out_of_range

__all__ = ["ShardedEmbedding", "ShardedEmbeddingBag"]

#: A request in flight: (server, its future).
_Call = tuple[int, torch.futures.Future[Any]]


class _Geo:
    """``geo`` mode: the rows this worker trains locally since the last exchange."""

    def __init__(self, dim: int, optimizer: SparseOptimizer) -> None:
        self.dim, self.optimizer = dim, optimizer
        self.clear()

    def clear(self) -> None:
        self.ids = torch.empty(0, dtype=torch.long)
        self.weight = torch.empty(0, self.dim)
        self.base = torch.empty(0, self.dim)
        self.state = self.optimizer.init_state(0, self.dim)
        self.steps = 0

    def add(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Cache freshly pulled rows (kept sorted by id)."""
        order = torch.argsort(torch.cat([self.ids, ids]))
        self.ids = torch.cat([self.ids, ids])[order]
        self.weight = torch.cat([self.weight, rows])[order]
        self.base = torch.cat([self.base, rows])[order]
        fresh = self.optimizer.init_state(len(ids), self.dim)
        self.state = {k: torch.cat([v, fresh[k]])[order] for k, v in self.state.items()}


class ShardedEmbedding(nn.Module):
    """An embedding table whose rows live on the parameter servers.

    Args:
        num_embeddings: rows of the table.
        embedding_dim: width of a row.
        sparse_optimizer: the rule servers apply to pushed rows (``ps.SGD``, ``ps.Adagrad``,
            ``ps.Adam``); default ``ps.SGD(lr=0.01)``.
        partition: ``"hash"`` (row ``i`` on server ``i % S``) or ``"range"``.
        mode: ``"sync"``, ``"async"`` or ``"geo"`` (see the module docstring).
        k_steps: ``geo``: steps between two exchanges with the servers.
        max_staleness: ``async``: steps whose pushes may be in flight before a pull waits.
        seed: seed of the initial rows (default: from the name); rows are uniform in
            ``[-init_scale, init_scale]`` (default ``1/sqrt(embedding_dim)``), the same whatever
            the number of servers (:func:`accel.ps.initial_weight` builds the whole table).
        name: the table's name on the servers and in checkpoints (default ``table_<n>``, in
            creation order: build the tables in the same order on every worker).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 sparse_optimizer: SparseOptimizer | None = None, partition: str = "hash",
                 mode: str = "sync", k_steps: int = 1, max_staleness: int | None = None,
                 seed: int | None = None, init_scale: float | None = None,
                 name: str | None = None) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; use 'sync', 'async' or 'geo'")
        if num_embeddings < 1 or embedding_dim < 1 or k_steps < 1:
            raise ValueError(f"num_embeddings ({num_embeddings}), embedding_dim "
                             f"({embedding_dim}) and k_steps ({k_steps}) must be >= 1")
        session = _session.current()
        if session.is_server:
            raise RuntimeError("ShardedEmbedding is built on workers; on a server call "
                               "accel.ps.run_server() (guard with `if ps.is_server():`)")
        self.name = name if name is not None else f"table_{session.table_count}"
        session.table_count += 1
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.sparse_optimizer = sparse_optimizer if sparse_optimizer is not None else SGD()
        self.mode, self.k_steps, self.max_staleness = mode, k_steps, max_staleness
        scale = init_scale if init_scale is not None else 1.0 / math.sqrt(embedding_dim)
        self._config = TableConfig(
            name=self.name, num_embeddings=num_embeddings, dim=embedding_dim,
            optimizer=self.sparse_optimizer.config(), partition=partition, mode=mode,
            seed=seed if seed is not None else zlib.crc32(self.name.encode()),
            init_scale=float(scale), workers=session.role.worker_num)
        self._partition = Partition(num_embeddings=num_embeddings, servers=session.role.server_num,
                                    kind=partition)
        self._worker = session.role.index
        self._seq = 0
        self._pending: list[list[_Call]] = []
        self._geo = _Geo(embedding_dim, self.sparse_optimizer)
        self._wait(self._broadcast(_remote.create_table, self._config.to_json()))
        session.tables.append(weakref.ref(self))

    def __getstate__(self) -> dict[str, Any]:
        # a copy (deepcopy, an EMA model) shares the servers' rows, not this one's requests
        state = self.__dict__.copy()
        state["_pending"] = []
        return state

    @property
    def _ps(self) -> _session.Session:
        return _session.current()  # not an attribute: copies of the module share the session

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, name={self.name!r}, "
                f"mode={self.mode!r}, optimizer={self.sparse_optimizer}")

    # -- transport -------------------------------------------------------------------------
    def _broadcast(self, fn: Any, *args: Any) -> list[_Call]:
        return [(s, self._ps.call(s, fn, *args))
                for s in range(self._ps.role.server_num)]

    def _wait(self, calls: Sequence[_Call]) -> list[Any]:
        return [self._ps.wait(s, f) for s, f in calls]

    def _by_server(self, ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        owner = self._partition.owner(ids)
        return [(s, owner == s) for s in range(self._ps.role.server_num)]

    def _pull(self, ids: torch.Tensor) -> torch.Tensor:
        parts = [(mask, s, self._ps.call(s, _remote.pull, self.name, ids[mask]))
                 for s, mask in self._by_server(ids) if bool(mask.any())]
        out = torch.empty(len(ids), self.embedding_dim)
        for mask, s, future in parts:
            out[mask] = self._ps.wait(s, future)
        return out

    def _check(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ShardedEmbedding {self.name!r} takes integer ids, got {ids.dtype}")
        error = out_of_range(ids, self.num_embeddings, self.name)
        if error is not None:
            raise error
        return ids.long()

    # -- modes -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Wait until every gradient this worker pushed is applied (errors raise here)."""
        pending, self._pending = self._pending, []
        for step in pending:
            self._wait(step)

    def _before_pull(self) -> None:
        if self.mode == "sync":
            self.flush()
            return
        while self._pending and (all(f.done() for _, f in self._pending[0]) or (
                self.max_staleness is not None and len(self._pending) > self.max_staleness)):
            self._wait(self._pending.pop(0))

    def _push(self, ids: torch.Tensor, grad: torch.Tensor) -> None:
        seq, self._seq = self._seq, self._seq + 1
        grad = grad.detach().float().cpu().contiguous()
        # sync: every server hears from every worker each step (an empty push completes the
        # round); async: only the servers that own a row of the batch
        self._pending.append([
            (s, self._ps.call(s, _remote.push, self.name, worker=self._worker, seq=seq,
                                   ids=ids[mask], grads=grad[mask]))
            for s, mask in self._by_server(ids) if self.mode == "sync" or bool(mask.any())])

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of the distinct ``ids``, as a leaf whose gradient goes to the servers."""
        train = self.training and torch.is_grad_enabled()
        if self.mode == "geo":
            return self._geo_rows(ids, train=train)
        self._before_pull()
        rows = self._pull(ids)
        if train:
            rows.requires_grad_(True)
            rows.register_hook(  # type: ignore[no-untyped-call]
                lambda grad: self._push(ids, grad))
        return rows

    def _geo_rows(self, ids: torch.Tensor, *, train: bool) -> torch.Tensor:
        geo = self._geo
        missing = ids[~torch.isin(ids, geo.ids)]
        if len(missing):
            geo.add(missing, self._pull(missing))
        slots = torch.searchsorted(geo.ids, ids)
        rows = geo.weight[slots].clone()
        if train:
            rows.requires_grad_(True)
            rows.register_hook(  # type: ignore[no-untyped-call]
                lambda grad: self._geo_step(slots, grad))
        return rows

    def _geo_step(self, slots: torch.Tensor, grad: torch.Tensor) -> None:
        geo = self._geo
        self.sparse_optimizer.apply(geo.weight, geo.state, slots, grad.detach().float().cpu())
        geo.steps += 1
        if geo.steps % self.k_steps == 0:
            self.push_deltas()

    def push_deltas(self) -> None:
        """``geo``: send the local changes now and drop the local rows (the next step pulls)."""
        geo = self._geo
        if len(geo.ids):
            delta = geo.weight - geo.base
            self._wait([(s, self._ps.call(s, _remote.add_delta, self.name,
                                               geo.ids[mask], delta[mask]))
                        for s, mask in self._by_server(geo.ids) if bool(mask.any())])
        geo.clear()

    def reset_cache(self) -> None:
        """Drop locally trained rows without pushing them (after a checkpoint is loaded)."""
        self._geo.clear()

    # -- public ----------------------------------------------------------------------------
    def pull(self, ids: torch.Tensor) -> torch.Tensor:
        """The servers' current rows of ``ids`` (after this worker's pushes are applied); no
        gradient."""
        self.flush()
        flat = self._check(torch.as_tensor(ids)).reshape(-1).cpu()
        unique, inverse = torch.unique(flat, return_inverse=True)
        with torch.no_grad():
            return self._pull(unique)[inverse].reshape(*torch.as_tensor(ids).shape, -1)

    def _lookup(self, input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(each id's position among the distinct ids, their rows), on the ids' device; the
        rows travel to and from the servers on the CPU."""
        ids = self._check(input)
        unique, inverse = torch.unique(ids.reshape(-1).cpu(), return_inverse=True)
        rows = self._rows(unique)
        return inverse.reshape(ids.shape).to(input.device), rows.to(input.device)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.embedding(*self._lookup(input))


class ShardedEmbeddingBag(ShardedEmbedding):
    """``nn.EmbeddingBag`` over a server-held table: sums or means of bags of rows.

    Takes ``input`` of shape ``(B, L)`` (fixed-size bags) or 1-D with ``offsets``, and
    ``per_sample_weights`` with ``mode="sum"``, as ``torch.nn.functional.embedding_bag``.
    Other arguments as :class:`ShardedEmbedding`.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "mean",
                 **kwargs: Any) -> None:
        if mode not in ("sum", "mean"):
            raise ValueError(f"ShardedEmbeddingBag mode={mode!r}; use 'sum' or 'mean' (the "
                             "training mode is ps_mode=...)")
        super().__init__(num_embeddings, embedding_dim, mode=kwargs.pop("ps_mode", "sync"),
                         **kwargs)
        self.bag_mode = mode

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        inverse, rows = self._lookup(input)
        return F.embedding_bag(inverse, rows, offsets, mode=self.bag_mode,
                               per_sample_weights=per_sample_weights)
