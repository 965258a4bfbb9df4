"""Horovod's elastic ``State`` and ``ObjectState``, with commits that survive a restart.

``commit()`` is Horovod's ``save()`` + ``check_host_updates()``, plus a write of the committed
state to this job's commit directory (:mod:`.store`), because under torchrun a lost worker
restarts the whole worker group and the survivors' memory goes with it. ``restore()`` undoes
the changes made since the last commit (or since construction, before the first commit).

Example:
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> state = hvd.elastic.ObjectState(epoch=0, batch=0)
    >>> state.epoch, state.batch = 1, 5
    >>> state.commit()
    >>> state.batch = 9
    >>> state.restore(); (state.epoch, state.batch)
    (1, 5)
    >>> state.clear_commits(); hvd.shutdown()
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .._session import current
from ..basics import rank as _rank
from .store import CommitStore, commit_root

__all__ = ["ObjectState", "State", "broadcast_object"]

OBJECTS = "objects"  # the commit file stem of ObjectState's attributes


def broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    """``root_rank``'s ``obj`` on every rank (pickled over the process group, never to disk)."""
    return current().comm.broadcast_object_list([obj], from_process=root_rank)[0]


class State:
    """Tracks state across workers (Horovod's ``horovod.common.elastic.State``).

    Subclasses implement ``save``/``restore``/``sync`` and, to survive a restart, name what a
    commit writes (:meth:`commit_components`) and how it is read back (:meth:`load_commit`).

    Args:
        bcast_object: ``f(obj, root_rank=0)`` broadcasting a Python object (default: the
            session's).
        get_rank: returns this worker's rank (default: ``hvd.rank``).
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None,
                 get_rank: Callable[[], int] | None = None) -> None:
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or _rank
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commit_number = -1  # the newest commit written or restored (-1: none)
        self._commit_path: Path | None = None
        self._store: CommitStore | None = None

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions to call after a reset (workers restarted, maybe with another world size).

        E.g. scale the learning rate with the new ``hvd.size()``.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state and write it where restarted workers find it; then check hosts.

        The write is one atomic checkpoint directory per rank (no collective): its cost is
        about that of writing the model and optimizer state to the commit directory's disk, so
        commit every N steps, trading the cost against the steps lost to a failure.
        """
        self.save()
        self._write_commit()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Horovod raises ``HostsUpdatedInterrupt`` here when hosts were added or removed.

        Under torchrun (``accel launch --max_restarts N``, ``--nnodes min:max``) there is
        nothing to poll: when a machine joins or a worker is lost, the agent stops and
        restarts the whole worker group, and :func:`~accel.horovod.elastic.run` resumes it
        from the last commit. So this returns at once, without a collective.
        """

    def save(self) -> None:
        """Save the state in memory (what :meth:`restore` goes back to)."""
        raise NotImplementedError(f"{type(self).__name__} must implement save()")

    def restore(self) -> None:
        """Undo the modifications made since the last commit."""
        raise NotImplementedError(f"{type(self).__name__} must implement restore()")

    def sync(self, root_rank: int = 0) -> None:
        """Make every worker's state ``root_rank``'s."""
        raise NotImplementedError(f"{type(self).__name__} must implement sync()")

    def reset(self) -> None:
        """Reset objects after a reset event, before the callbacks (nothing by default)."""

    # -- commits on disk ----------------------------------------------------------------
    def commit_components(self) -> dict[str, Any]:
        """What a commit writes: file stem -> nested state (tensors, numbers, strings, ...)."""
        return {}

    def load_commit(self, components: dict[str, Any]) -> None:
        """Apply components read back from a commit (the inverse of commit_components)."""

    def commit_stems(self) -> list[str]:
        return list(self.commit_components())

    def local_stems(self) -> list[str]:
        """Components that are each rank's own (read from its own commit before a sync)."""
        return []

    def load_local(self, components: dict[str, Any]) -> None:
        """Apply this rank's own components (``local_stems``) before a sync."""

    def commit_store(self) -> CommitStore:
        if self._store is None:
            session = current()
            root = commit_root(session.setup.settings, session.setup.launch)
            self._store = CommitStore(root, session.context.rank)
        return self._store

    def _write_commit(self) -> None:
        number = self._commit_number + 1
        path = self.commit_store().write(number, self.commit_components(),
                                         current().context.world_size)
        self._commit_number, self._commit_path = number, path

    def read_commit(self, path: Path, number: int) -> None:
        """Load the commit at ``path`` into this state (the rank that holds the newest one)."""
        self.load_commit(self.commit_store().read(path, self.commit_stems()))
        self._commit_number, self._commit_path = number, path

    def continue_from(self, number: int) -> None:
        """The next commit is numbered ``number + 1`` (every rank, after a resume)."""
        self._commit_number = max(self._commit_number, number)

    def read_local(self, path: Path) -> None:
        """Load this rank's own parts of its commit at ``path`` (same number as the newest)."""
        if self.local_stems():
            self.load_local(self.commit_store().read(path, self.local_stems()))

    def clear_commits(self) -> None:
        """Remove this rank's commits (done by ``hvd.elastic.run`` when training ends)."""
        self.commit_store().remove_mine()
        self._commit_path = None


class ObjectState(State):
    """State of plain Python values, given as keyword arguments and exposed as attributes.

    A commit writes them without pickle: keep them to numbers, strings, booleans, None, lists,
    tuples, dicts, sets, tensors and numpy arrays.
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None,
                 get_rank: Callable[[], int] | None = None, **kwargs: Any) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self, root_rank: int = 0) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def commit_components(self) -> dict[str, Any]:
        return {OBJECTS: self._saved_state}

    def load_commit(self, components: dict[str, Any]) -> None:
        self._saved_state = dict(components[OBJECTS])
        self._set_attrs()
