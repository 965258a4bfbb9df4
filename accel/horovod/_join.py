"""The joined side of ``hvd.join()``: take part in the others' collectives until all have joined.

A rank that calls ``hvd.join()`` registers in the current round (see
:mod:`accel.horovod._join_state`, which also explains why no collective is missed) and then
follows the global set, and every process set it belongs to, from its own op counts on: for
op ``k`` of a set it writes ``J`` under its own key, waits until every other rank of the set
has written either ``J`` (joined too) or the op's description, and issues the matching
collective with neutral data. The calling thread follows the global set and one thread each
process set (with its own store connection): the other ranks may issue ops on different sets
in any order, and a set whose next op waits must not hold back the others.

==================  =======================================================================
allreduce           zeros (Sum, Average: Average still divides by the set's size); Min, Max,
                    Product get their neutral element and are refused on the other ranks
Adasum              zeros (a zero gradient is neutral in Adasum's pairwise combination)
broadcast           receives (a joined root sends zeros; refused)
allgather           zero rows
alltoall            sends zero rows, receives the others' (refused)
reducescatter       zeros (refused)
barrier             a barrier
objects             ``broadcast_object`` receives; ``allgather_object`` sends None (refused)
add_process_set     registers the same set (its group is created on every rank)
==================  =======================================================================

Refused ops are still matched, so that nobody waits forever: the ranks that issued them raise
``HorovodInternalError`` once they complete. On process sets every op but a broadcast from a
rank that has not joined is refused (``hvd.join()`` joins the global set, as in Horovod).

A set is done when every one of its ranks has written ``J`` for the same op (all have joined:
no more ops on it this round); the round ends when the global set and every followed process
set are done. Every rank then holds the same op counts, and the registry's last line names the
rank that joined last.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch
import torch.distributed as dist

from ._join_state import JOINED, JoinState, joins_of
from ._plumbing import Scope, barrier_of, torch_op
from ._session import Session
from .exceptions import HorovodInternalError
from .process_sets import ProcessSet, register
from .reduce_op import Max, Min, Product

__all__ = ["join_round", "mirror"]

#: ``all_gather_single`` replaces the deprecated ``all_gather_into_tensor`` in newer torch
_ALL_GATHER_INTO = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def join_round(scope: Scope) -> int:
    """Join the current round on the global set ``scope``; returns the rank that joined last."""
    session = scope.session
    state = joins_of(session)
    if state is None:
        return _arrival_order(scope)
    counts = state.counts()
    sets = {set_id: counts.get(set_id, 0) for set_id in _sets_of(session)}
    generation = state.register({**counts, **sets})
    followers = _Followers(state=state, scope=scope, generation=generation)
    for set_id, seq in sets.items():
        if set_id != 0:
            followers.start(set_id, seq)
    final = followers.follow(0, sets[0], store=state.store)
    registry = state.registry(generation)  # complete: every rank has joined
    followers.release(registry)
    final.update(followers.join())
    state.end_round(generation, final)
    return list(registry)[-1]


def _arrival_order(scope: Scope) -> int:
    """Without a key-value store (no join state): every rank must reach ``join`` before any
    other collective, and ties go to the highest rank."""
    arrivals = torch.zeros(scope.size, dtype=torch.int64, device=scope.wire)
    arrivals[scope.rank] = scope.rank
    dist.all_reduce(arrivals, group=scope.group)
    return int(arrivals.argmax().item())


def _sets_of(session: Session) -> list[int]:
    """The sets this rank follows: the global one and each of more than one rank it is in."""
    me = session.context.rank
    return [0] + [set_id for set_id, process_set in session.process_sets.items()
                  if set_id != 0 and me in process_set.ranks and len(process_set.ranks) > 1]


def _members(session: Session, set_id: int) -> list[int]:
    if set_id == 0:
        return list(range(session.context.world_size))
    ranks: list[int] = session.process_sets[set_id].ranks
    return ranks


class _Followers:
    """Who follows which set on a joined rank: the caller the global set, one thread each
    process set, so that a set whose next op waits never holds back another set's (the
    ranks that have not joined issue ops on different sets in their own order)."""

    def __init__(self, *, state: JoinState, scope: Scope, generation: int) -> None:
        self.state, self.scope, self.generation = state, scope, generation
        self.threads: list[threading.Thread] = []
        self.set_ids: list[int] = []
        self.final: dict[int, int] = {}
        self.errors: list[BaseException] = []

    def start(self, set_id: int, seq: int) -> None:
        """Follow a process set from op ``seq`` on, in a thread with its own store client."""
        thread = threading.Thread(target=self._run, args=(set_id, seq), daemon=True,
                                  name=f"accel-hvd-join-set{set_id}")
        thread.start()
        self.threads.append(thread)
        self.set_ids.append(set_id)

    def _run(self, set_id: int, seq: int) -> None:
        try:
            store = self.state.store.clone()  # type: ignore[attr-defined]
            self.final.update(self.follow(set_id, seq, store=store))
        except BaseException as exc:  # noqa: BLE001 - re-raised by join() in the joining thread
            self.errors.append(exc)

    def release(self, registry: dict[int, dict[int, int]]) -> None:
        """Every rank has joined: no process set has an op past the largest count registered
        for it. Mark that op ``J`` for every rank of the set, so that its follower ends there
        even if a rank does not follow the set (it removed the set before it joined)."""
        state, generation = self.state, self.generation
        for set_id in self.set_ids:
            target = max((counts.get(set_id, 0) for counts in registry.values()), default=0)
            keys = [state.key(generation, "op", set_id, target, r)
                    for r in _members(self.scope.session, set_id)]
            state.store.multi_set(keys, [JOINED] * len(keys))  # type: ignore[attr-defined]
            state.wrote(generation, keys)

    def join(self) -> dict[int, int]:
        """Wait for the process sets' followers; their sets' final op counts."""
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise self.errors[0]
        return dict(self.final)

    def follow(self, set_id: int, seq: int, *, store: dist.Store) -> dict[int, int]:
        """Take part in the set's ops from ``seq`` on until every rank of the set has joined;
        returns ``{set_id: the set's op count}``."""
        state, generation, me = self.state, self.generation, self.scope.rank
        members = _members(self.scope.session, set_id)
        while True:
            keys = [state.key(generation, "op", set_id, seq, r) for r in members]
            mine = keys[members.index(me)]
            store.set(mine, JOINED)
            state.wrote(generation, [mine])
            _wait(store, keys)
            described = [value for value in store.multi_get(keys) if value != JOINED.encode()]
            if not described:  # every rank of the set has joined: no more ops this round
                return {set_id: seq}
            mirror(json.loads(described[0]), scope=self.scope, set_id=set_id,
                   followers=self)
            seq += 1


def _wait(store: dist.Store, keys: list[str]) -> None:
    """Wait for ``keys`` as long as it takes (a rank may train for hours before it joins)."""
    while True:
        try:
            store.wait(keys)
            return
        except dist.DistStoreError as exc:
            if "timeout" not in str(exc).lower():
                raise


def mirror(desc: list[Any], *, scope: Scope, set_id: int, followers: _Followers) -> None:
    """Issue the collective that matches another rank's op ``desc``, with neutral data."""
    kind, args = desc[0], desc[1:]
    session, wire = scope.session, scope.wire
    group = None if set_id == 0 else session.process_sets[set_id].group
    size = len(_members(session, set_id))
    if kind == "add_process_set":
        process_set = register(session, ProcessSet(args[0]), session.next_process_set_id())
        if scope.rank in process_set.ranks and len(process_set.ranks) > 1:
            followers.start(process_set.process_set_id or 0, 0)  # from its first op on
    elif kind == "allgather":
        session.comm.gather([torch.zeros((0, *shape), dtype=_dtype(name, scope=scope), device=wire)
                             for name, shape in args[0]], group=group)
    elif kind == "barrier":
        barrier_of(session, group)
    elif kind == "broadcast_object":
        dist.broadcast_object_list([None], src=args[0], group=group, device=wire)
    elif kind == "allgather_object":
        dist.all_gather_object([None] * size, None, group=group)
    elif kind == "alltoall":
        _alltoall(_dtype(args[0], scope=scope), trailing=tuple(args[1]), group=group, size=size,
                  wire=wire)
    else:
        for work in _tensor_ops(kind, args=args, group=group, size=size, scope=scope):
            work.wait()


def _tensor_ops(kind: str, *, args: list[Any], group: Any, size: int,
                scope: Scope) -> list[Any]:
    """Start the collectives of an allreduce, broadcast, Adasum or reducescatter."""
    works: list[Any] = []
    wire = scope.wire
    if kind == "allreduce":
        op, sizes = args
        for name, numel in sizes:
            neutral = _neutral(op, dtype=_dtype(name, scope=scope), numel=numel, wire=wire)
            works.append(dist.all_reduce(neutral,
                                         op=torch_op(op), group=group, async_op=True))
    elif kind == "broadcast":
        root, sizes = args
        for name, numel in sizes:
            zeros = torch.zeros(numel, dtype=_dtype(name, scope=scope), device=wire)
            works.append(dist.broadcast(zeros,
                                        src=root, group=group, async_op=True))
    elif kind == "adasum":
        for name, numel in args[0]:
            zeros = torch.zeros(numel, dtype=_dtype(name, scope=scope), device=wire)
            works.append(_ALL_GATHER_INTO(zeros.new_empty(size * numel), zeros, group=group,
                                          async_op=True))
    elif kind == "reducescatter":
        for name, shape in args[0]:
            buf = torch.zeros(shape, dtype=_dtype(name, scope=scope), device=wire)
            if shape[0] % size:  # an uneven split: the whole tensor is reduced
                works.append(dist.all_reduce(buf, group=group, async_op=True))
                continue
            out = buf.new_empty((shape[0] // size, *shape[1:]))
            works.append(dist.reduce_scatter_tensor(out.view(-1), buf.view(-1), group=group,
                                                    async_op=True))
    else:
        raise HorovodInternalError(f"hvd.join(): another rank issued {kind!r}, which this "
                                   "version of accel.horovod cannot take part in; run the same "
                                   "accel version on every rank")
    return works


def _alltoall(dtype: torch.dtype, *, trailing: tuple[int, ...], group: Any, size: int,
              wire: torch.device) -> None:
    """An alltoall's two exchanges (split sizes, then rows), sending nothing."""
    received = torch.empty(size, dtype=torch.int64, device=wire)
    dist.all_to_all_single(received, torch.zeros(size, dtype=torch.int64, device=wire),
                           group=group)
    counts = received.tolist()
    out = torch.empty((sum(counts), *trailing), dtype=dtype, device=wire)
    dist.all_to_all_single(out, torch.empty((0, *trailing), dtype=dtype, device=wire),
                           output_split_sizes=counts, input_split_sizes=[0] * size,
                           group=group)


def _neutral(op: int, *, dtype: torch.dtype, numel: int, wire: torch.device) -> torch.Tensor:
    """What a joined rank adds to a reduction: zeros, or the op's neutral element for
    Min/Max/Product (so that a refused in-place reduction holds the others' result)."""
    value: float | int | bool = 0
    if op == Product:
        value = 1
    elif op in (Min, Max) and dtype == torch.bool:
        value = op == Min
    elif op in (Min, Max) and dtype.is_floating_point:
        value = float("inf") if op == Min else float("-inf")
    elif op in (Min, Max) and not dtype.is_complex:
        info = torch.iinfo(dtype)
        value = info.max if op == Min else info.min
    return torch.full((numel,), value, dtype=dtype, device=wire)


def _dtype(name: str, *, scope: Scope | None = None) -> torch.dtype:
    """The dtype named ``name``; with ``scope``, the dtype it travels in there."""
    dtype = getattr(torch, name.rpartition(".")[2], None)
    if isinstance(dtype, torch.dtype) and scope is not None:
        dtype = scope.wire_dtype(dtype)
    if not isinstance(dtype, torch.dtype):
        raise HorovodInternalError(f"hvd.join(): another rank described dtype {name!r}, which "
                                   "this torch does not have; run the same versions everywhere")
    return dtype
