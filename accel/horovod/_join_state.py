"""The bookkeeping behind ``hvd.join()`` on the ranks that have not joined (yet).

torch.distributed matches collectives by their order on a group, so a rank waiting in
``hvd.join()`` can take part in the others' collectives only if it learns what each of them
issues next. Each session keeps one :class:`JoinState` (started by ``hvd.init()``) that
does this without any cost on the fast path:

* Every collective of ``accel.horovod`` on a set of more than one rank is counted per set:
  ``begin`` gives it the set's next sequence number and records its description (kind, dtypes,
  sizes, reduce op, root) in memory, under a lock (microseconds), before it is issued;
  ``done`` drops the records it no longer needs once it has completed.
* A rank that joins appends its per-set counts to the round's registry key in the c10d store
  and wakes every rank's watcher: a daemon thread per session blocked in ``store.wait`` on its
  own wake key (its own store connection; stopped by ``hvd.shutdown()``).
* The woken watcher marks the round as seen and publishes every recorded description; from
  then on, the main thread publishes each description itself before issuing the collective
  (the slow path, only while a round has a joined rank). The joined ranks read the
  descriptions and issue matching collectives (see :mod:`accel.horovod._join`).

Why no collective is missed: ``begin`` records and reads the seen-flag under the lock, and the
watcher sets the flag and snapshots the records under the same lock, so each description is
either in the watcher's snapshot or published by the main thread; it does not matter whether
the op was issued just before or just after another rank joined. A record is dropped only
when its collective has completed on this rank and that proves every rank of the set issued it
(reductions, gathers, all-to-all; not a broadcast's root, which may finish alone): a rank that
joined before that op could not have taken part, so nobody still needs it.

Why every rank that has not joined takes the same decision on a refused op (``Max`` while a
rank has joined, ``alltoall``, ...): refusing before issuing would be a race (another rank may
issue it before its watcher woke, and would then wait forever), so refused ops are issued too,
the joined ranks take part with neutral data, and the error is raised once the collective has
completed. By then every joined rank that took part had registered (a joined rank registers
before it takes part in anything), and every rank that issued the op had published its
description, hence seen the round: each reads the same registry entries for that op.

Keys live under ``accel/horovod/join/s<session>/<round>/``: ``wake/<rank>``, ``joined`` (the
registry, one line per rank in arrival order), ``arrivals`` and ``op/<set>/<seq>/<rank>`` (a
description, or ``J`` from a joined rank). Each rank deletes the keys it wrote in a round at the
end of the next round, when nobody can read them any more.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch.distributed as dist

from ._session import Session
from .exceptions import HorovodInternalError
from .reduce_op import Max, Min, Product, name_of

__all__ = ["ANY", "JOINED", "NEVER", "JoinState", "Ticket", "Where", "begin", "done", "joins_of",
           "refusal", "refuse_untracked", "start_joins", "stop_joins"]

#: ``Ticket.refuse``: the op works while ranks have joined ...
NEVER = -2
#: ... or it is refused when any other rank of its set has joined (a rank >= 0: when that rank,
#: a broadcast's root, has joined)
ANY = -1
#: what a joined rank publishes for an op it takes part in with neutral data
JOINED = "J"
_EXTRAS = "horovod.join"
_PREFIX = "accel/horovod/join"
#: records kept at most per set (only a program that never waits for anything gets near it)
_RECORDS = 4096
#: the watcher's wait; on timeout it simply waits again
_WATCH = timedelta(days=1)


@dataclass(kw_only=True, slots=True)
class Ticket:
    """One counted collective: what ``done`` needs once it has completed."""

    set_id: int
    seq: int
    generation: int
    refuse: int  # NEVER, ANY or a rank (see above)
    what: str  # the op's name in the error, e.g. "alltoall"
    why: str  # the end of the error: why it is refused and what to do
    complete: bool  # completion proves that every rank of the set issued it


class Where(Protocol):
    """Where a collective runs (:class:`accel.horovod._plumbing.Scope` is one)."""

    @property
    def session(self) -> Session: ...

    @property
    def set_id(self) -> int: ...

    @property
    def distributed(self) -> bool: ...


class JoinState:
    """Counts, records and the watcher of one session (see the module docstring)."""

    def __init__(self, *, session: Session, store: dist.Store, prefix: str) -> None:
        self.rank = session.context.rank
        self.world = session.context.world_size
        self.store = store
        self.prefix = prefix
        self.process_sets = session.process_sets  # the session's dict: current memberships
        self.generation = 1  # the current join round
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}
        self._records: dict[int, deque[tuple[int, tuple[Any, ...]]]] = {}
        self._seen = 0  # the latest round in which this rank saw a join
        self._watching = 1  # the round whose wake key the watcher waits on
        self._stopping = False
        self._written: dict[int, list[str]] = {}  # round -> keys this rank set
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"accel-hvd-join-{self.rank}")
        self._thread.start()

    def key(self, generation: int, *parts: object) -> str:
        return "/".join([self.prefix, str(generation), *map(str, parts)])

    # -- ranks that have not joined ---------------------------------------------------------
    def begin(self, set_id: int, *, desc: tuple[Any, ...], what: str, refuse: int, why: str,
              complete: bool) -> Ticket:
        """Count and record one collective, just before it is issued."""
        with self._lock:
            seq = self._counts.get(set_id, 0)
            self._counts[set_id] = seq + 1
            records = self._records.get(set_id)
            if records is None:
                records = self._records[set_id] = deque(maxlen=_RECORDS)
            records.append((seq, desc))
            generation = self.generation
            slow = self._seen >= generation
        if slow:
            self.publish(self.store, generation, [(set_id, seq, desc)])
        return Ticket(set_id=set_id, seq=seq, generation=generation, refuse=refuse, what=what,
                      why=why, complete=complete)

    def done(self, ticket: Ticket) -> None:
        """After the collective completed: drop records; raise if it is refused."""
        with self._lock:
            records = self._records.get(ticket.set_id)
            if ticket.complete and records is not None:
                while records and records[0][0] <= ticket.seq:
                    records.popleft()
            slow = self._seen >= ticket.generation
        if slow and ticket.refuse != NEVER:
            self._check(ticket)

    def _check(self, ticket: Ticket) -> None:
        registry = self.registry(ticket.generation)
        if ticket.refuse == ANY:
            process_set = self.process_sets.get(ticket.set_id)
            members: Sequence[int] = (range(self.world) if ticket.set_id == 0 or
                                      process_set is None else process_set.ranks)
        else:
            members = (ticket.refuse,)
        joined = [r for r in members if r != self.rank and r in registry
                  and registry[r].get(ticket.set_id, 0) <= ticket.seq]
        if joined:
            who = (f"rank {joined[0]} has" if len(joined) == 1
                   else f"ranks {', '.join(map(str, joined))} have")
            raise HorovodInternalError(f"hvd.{ticket.what}: {who} called hvd.join() and "
                                       f"{ticket.why}")

    def publish(self, store: dist.Store, generation: int,
                items: Sequence[tuple[int, int, tuple[Any, ...]]]) -> None:
        """Describe ops in the store for the joined ranks (idempotent)."""
        if not items:
            return
        keys = [self.key(generation, "op", set_id, seq, self.rank) for set_id, seq, _ in items]
        # multi_set and append exist at run time but are missing from torch's stub
        store.multi_set(  # type: ignore[attr-defined]
            keys, [json.dumps(desc, default=str) for _, _, desc in items])
        self.wrote(generation, keys)

    def wrote(self, generation: int, keys: Sequence[str]) -> None:
        with self._lock:
            self._written.setdefault(generation, []).extend(keys)

    # -- the registry and the rounds --------------------------------------------------------
    def registry(self, generation: int) -> dict[int, dict[int, int]]:
        """The ranks that joined in a round, in arrival order, with their counts per set."""
        key = self.key(generation, "joined")
        if not self.store.check([key]):
            return {}
        entries: dict[int, dict[int, int]] = {}
        for line in self.store.get(key).decode().splitlines():
            rank, _, counts = line.partition(" ")
            entries[int(rank)] = {int(s): n for s, n in json.loads(counts).items()}
        return entries

    def counts(self) -> dict[int, int]:
        with self._lock:
            return dict(self._counts)

    def register(self, counts: dict[int, int]) -> int:
        """Join the current round: the registry line, then (first to join) wake everyone."""
        generation = self.generation
        self.store.append(self.key(generation, "joined"),  # type: ignore[attr-defined]
                          f"{self.rank} {json.dumps(counts)}\n")
        if self.store.add(self.key(generation, "arrivals"), 1) == 1:
            self.wrote(generation, [self.key(generation, "joined"),
                                    self.key(generation, "arrivals")])
            wakes = [self.key(generation, "wake", r) for r in range(self.world)]
            self.store.multi_set(wakes, ["join"] * self.world)  # type: ignore[attr-defined]
        return generation

    def end_round(self, generation: int, counts: dict[int, int]) -> None:
        """Every rank has joined: agree on the counts, start the next round, and delete the
        keys this rank wrote in the previous one (nobody reads them any more)."""
        with self._lock:
            self._counts.update(counts)
            for records in self._records.values():
                records.clear()
            self.generation = generation + 1
            old = self._written.pop(generation - 1, [])
        self.wrote(generation, [self.key(generation, "wake", self.rank)])
        for key in old:
            self.store.delete_key(key)

    # -- the watcher ------------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            # its own connection: a blocking wait would hold the main thread's one
            store = self.store.clone()  # type: ignore[attr-defined]
        except RuntimeError:
            return  # no second connection: joined ranks are seen at the next join only
        while True:
            with self._lock:
                if self._stopping:
                    return
                generation = self._watching
            key = self.key(generation, "wake", self.rank)
            try:
                store.wait([key], _WATCH)
                woken = store.get(key)
            except RuntimeError as exc:
                if isinstance(exc, dist.DistStoreError) and "timeout" in str(exc).lower():
                    continue  # a day without a join: wait again
                return  # the store is gone: the job is over
            if not self._woken(store, generation=generation, stop=woken == b"stop"):
                return

    def _woken(self, store: dist.Store, *, generation: int, stop: bool) -> bool:
        """A rank joined (or ``stop``): publish what is in flight; False to stop watching."""
        with self._lock:
            if self._stopping or stop:
                return False
            self._watching = generation + 1
            if generation < self.generation:
                return True  # a round this rank has finished already
            self._seen = max(self._seen, generation)
            items = [(set_id, seq, desc) for set_id, records in self._records.items()
                     for seq, desc in records]
        try:
            self.publish(store, generation, items)
        except RuntimeError:
            return False
        return True

    def stop(self) -> None:
        """Stop the watcher (``hvd.shutdown()``, or at exit)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            generation = self._watching
        try:
            self.store.set(self.key(generation, "wake", self.rank), "stop")
        except RuntimeError:
            return  # the store is gone, and with it the watcher's wait
        self._thread.join(timeout=5.0)


def start_joins(session: Session) -> None:
    """Start the session's join state (``hvd.init()``; a job of one process needs none)."""
    ctx = session.context
    store = session.setup.group.store()
    if ctx.world_size <= 1 or not ctx.is_distributed or store is None:
        return
    # the n-th session of every rank gets the same keys, apart from an earlier session's
    number = store.add(f"{_PREFIX}/sessions/{ctx.rank}", 1)
    state = JoinState(session=session, store=store, prefix=f"{_PREFIX}/s{number}")
    session.extras[_EXTRAS] = state
    register = getattr(threading, "_register_atexit", None)
    if register is not None:  # stop the watcher before the interpreter winds down
        try:
            register(state.stop)
        except RuntimeError:  # the interpreter is already shutting down
            state.stop()


def stop_joins(session: Session) -> None:
    state = session.extras.pop(_EXTRAS, None)
    if isinstance(state, JoinState):
        state.stop()


def refuse_untracked(session: Session, *, group: Any, what: str) -> None:
    """Before a collective a joined rank cannot take part in (it is not issued through
    ``begin``): raise if a rank of ``group`` (None: every rank) is known to have joined.

    Only a rank whose watcher has seen the join can know it (a rank that issues the collective
    in the moment between another rank's join and its watcher waking waits for it)."""
    state = joins_of(session)
    if state is None or state._seen < state.generation:
        return  # the fast path: nobody has joined (as far as this rank knows)
    ranks = None if group is None else dist.get_process_group_ranks(group)
    joined = [r for r in state.registry(state.generation)
              if r != state.rank and (ranks is None or r in ranks)]
    if joined:
        raise HorovodInternalError(
            f"hvd.{what}: rank {joined[0]} has called hvd.join(), and a joined rank can not "
            "take part in its collectives (they do not go through accel.horovod's ops); run it "
            "before any of its ranks joins, or put the model in eval() mode")


def joins_of(session: Session) -> JoinState | None:
    state = session.extras.get(_EXTRAS)
    return state if isinstance(state, JoinState) else None


def begin(scope: Where, *, desc: tuple[Any, ...], what: str, op: int | None = None,
          root: int | None = None) -> Ticket | None:
    """Count one collective of ``scope`` just before it is issued (None: nothing to count).

    ``desc`` starts with the kind (see :func:`accel.horovod._join.mirror`); ``op`` is an
    allreduce's Horovod op, ``root`` a broadcast's root (a global rank)."""
    state = joins_of(scope.session)
    if state is None or not scope.distributed:
        return None
    refuse, why = refusal(scope.set_id, kind=desc[0], op=op, root=root)
    ticket: Ticket = state.begin(scope.set_id, desc=desc, what=what, refuse=refuse, why=why,
                                 complete=root is None and desc[0] != "add_process_set")
    return ticket


def done(scope: Where, ticket: Ticket | None) -> None:
    """After the collective of ``ticket`` completed (raises if it is refused)."""
    if ticket is not None:
        state = joins_of(scope.session)
        if state is not None:
            state.done(ticket)


_LATER = ("call it before any rank calls hvd.join(), or make every rank reach it (e.g. agree "
          "on the number of steps first with hvd.allreduce(torch.tensor(steps), op=hvd.Min))")


def refusal(set_id: int, *, kind: str, op: int | None = None,
            root: int | None = None) -> tuple[int, str]:
    """``(refuse, why)`` for a collective: when it is refused while ranks have joined."""
    if root is not None:  # a broadcast: joined ranks receive
        return root, ("is the root of this broadcast: a joined rank has nothing to send; "
                      "broadcast from a rank that has not joined")
    if set_id != 0:
        return ANY, ("is in this process set: a joined rank takes part in the collectives of "
                     "the global process set only (hvd.join() joins that set, as in Horovod); "
                     "issue collectives on process sets before any of their ranks joins")
    if kind == "allreduce" and op in (Min, Max, Product):
        return ANY, (f"can only take part with zeros, which op=hvd.{name_of(op)} would count; "
                     f"reduce with hvd.Sum or hvd.Average while ranks have joined, or {_LATER}")
    if kind in ("alltoall", "reducescatter", "allgather_object"):
        return ANY, (f"{kind} is not supported while a rank has joined (as in Horovod); "
                     f"{_LATER}")
    return NEVER, ""
