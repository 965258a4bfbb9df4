"""Horovod's process sets: collectives over a subset of the job's processes.

A :class:`ProcessSet` names some ranks; once registered (``hvd.init(process_sets=[...])`` or
``hvd.add_process_set``) it owns a torch.distributed subgroup, created through accel's
distributed layer, and the collectives of ``accel.horovod`` take it as ``process_set=``.
``global_process_set`` (id 0) is every rank: the default process group.

Example:
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> hvd.global_process_set.process_set_id, hvd.global_process_set.size()
    (0, 1)
    >>> hvd.global_process_set.included(), hvd.global_process_set.rank()
    (True, 0)
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from ..distributed.group import new_subgroup
from ._join_state import NEVER, joins_of
from ._session import Session, current, installed

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "group_of", "register",
           "register_initial_sets", "remove_process_set"]


class ProcessSet:
    """A set of ranks that runs collectives together (``horovod.torch.ProcessSet``).

    Args:
        ranks_or_comm: the ranks of the set (an MPI communicator is not accepted: accel has no
            MPI build; pass the ranks).
    """

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        if not isinstance(ranks_or_comm, Sequence) or isinstance(ranks_or_comm, str):
            raise TypeError(f"ProcessSet({ranks_or_comm!r}): pass a list of ranks (accel.horovod "
                            "runs on torch.distributed, not on MPI communicators)")
        self.ranks: list[int] = sorted({int(r) for r in ranks_or_comm})
        self.process_set_id: int | None = None
        #: the torch subgroup (``None`` = the default group, for the global set)
        self.group: Any = None

    def _registered(self) -> bool:
        return self.process_set_id is not None and _live(self)

    def size(self) -> int | None:
        """The number of ranks in the set; None while it is not registered."""
        if not self._registered():
            return None
        return len(self.ranks) if self.process_set_id != 0 else current().context.world_size

    def rank(self) -> int | None:
        """This process's rank inside the set; None while unregistered, -1 when not a member."""
        if not self._registered():
            return None
        me = current().context.rank
        if self.process_set_id == 0:
            return me
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process belongs to the set; None while it is not registered."""
        if not self._registered():
            return None
        return self.process_set_id == 0 or current().context.rank in self.ranks

    def __repr__(self) -> str:
        ranks = "all" if self.process_set_id == 0 else self.ranks
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks})"


def _live(process_set: ProcessSet) -> bool:
    session = installed()
    return session is not None and session.process_sets.get(
        process_set.process_set_id or 0) is process_set


#: Every process of the job (Horovod's ``hvd.global_process_set``, id 0).
global_process_set = ProcessSet([])


def _check_new(session: Session, process_set: ProcessSet) -> None:
    world = session.context.world_size
    if not process_set.ranks or process_set.ranks[-1] >= world or process_set.ranks[0] < 0:
        raise ValueError(f"{process_set!r}: ranks must lie in 0..{world - 1}")
    for other in session.process_sets.values():
        if other.process_set_id != 0 and other.ranks == process_set.ranks:
            raise ValueError(f"a process set with ranks {process_set.ranks} is already "
                             f"registered (id {other.process_set_id}); use that one")


def register(session: Session, process_set: ProcessSet, set_id: int) -> ProcessSet:
    """Register ``process_set`` under ``set_id`` (collective for a new subgroup)."""
    world = session.context.world_size
    if set_id != 0:
        _check_new(session, process_set)
        process_set.group = new_subgroup(process_set.ranks) if world > 1 else None
    process_set.process_set_id = set_id
    session.process_sets[set_id] = process_set
    return process_set


def register_initial_sets(session: Session, sets: Sequence[ProcessSet] | str | None) -> None:
    """Register the global set and those given to ``hvd.init(process_sets=...)``."""
    register(session, global_process_set, 0)
    if sets is None or sets == "dynamic":
        return
    if isinstance(sets, str):
        raise ValueError(f"hvd.init(process_sets={sets!r}): pass a list of ProcessSet or "
                         "'dynamic'")
    for process_set in sets:
        register(session, process_set, session.next_process_set_id())


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set after ``init`` (collective: every rank calls it, same order)."""
    session = current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set._registered():
        raise ValueError(f"{process_set!r} is already registered")
    _check_new(session, process_set)
    joins = joins_of(session)
    if joins is not None:  # every rank creates the group: a joined rank too (never refused)
        joins.begin(0, desc=("add_process_set", process_set.ranks), what="add_process_set",
                    refuse=NEVER, why="", complete=False)
    return register(session, process_set, session.next_process_set_id())


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (not the global one); True when it was registered."""
    session = current()
    if process_set.process_set_id in (None, 0) or not process_set._registered():
        return False
    del session.process_sets[process_set.process_set_id]
    if process_set.group is not None and dist.is_initialized():
        dist.destroy_process_group(process_set.group)
    process_set.group, process_set.process_set_id = None, None
    return True


def group_of(process_set: ProcessSet | None) -> Any:
    """The torch group a collective over ``process_set`` runs on (None = the default group).

    Raises naming the fix when the set is not registered or this rank is not a member.
    """
    if process_set is None or process_set.process_set_id == 0:
        current()
        return None
    if not process_set._registered():
        raise ValueError(f"{process_set!r} is not registered; pass it to hvd.init(process_sets="
                         "[...]) or call hvd.add_process_set() on every rank first")
    if not process_set.included():
        raise ValueError(f"rank {current().context.rank} is not in {process_set!r}; call this "
                         "collective only on the ranks of the set")
    return process_set.group
