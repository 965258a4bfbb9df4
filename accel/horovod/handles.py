"""Handles of asynchronous collectives: ``hvd.poll(handle)`` and ``hvd.synchronize(handle)``.

An ``*_async`` collective returns an int handle (as Horovod's do). The handle names the
torch.distributed work objects still in flight and what turns their buffers into the result
(scaling, copying back, unflattening); ``synchronize`` waits for them, runs that step once and
returns the result. A handle is used once: a second ``synchronize`` (or one on a handle this
session never issued) raises, rather than Horovod's silent ``None``, so a double wait is found.

As in Horovod, a named operation (``name="grad.w"``) may not start while another of the same
kind and name is still pending (issued, not yet synchronized): :func:`check_name` raises
``ValueError`` on the rank that issues the second one, before anything is sent. Every rank runs
the same program, so they all raise at the same call.

Example:
    >>> import torch
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> h = hvd.allreduce_async(torch.tensor([2.0]), op=hvd.Sum)
    >>> hvd.poll(h), hvd.synchronize(h).tolist()
    (True, [2.0])
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._session import current

__all__ = ["check_name", "poll", "submit", "synchronize"]

_KEY = "horovod.handles"


@dataclass(kw_only=True, slots=True)
class _Pending:
    works: Sequence[Any]  # torch.distributed Work objects (empty when already done)
    finish: Callable[[], Any]  # builds the result once the works are done
    name: str | None = None  # "<kind>.<name>" of a named operation


@dataclass(kw_only=True, slots=True)
class _Table:
    next_id: int = 1
    pending: dict[int, _Pending] = field(default_factory=dict)


def _table() -> _Table:
    extras = current().extras
    table = extras.get(_KEY)
    if table is None:
        table = extras[_KEY] = _Table()
    assert isinstance(table, _Table)
    return table


def check_name(kind: str, name: str | None) -> str | None:
    """``"<kind>.<name>"`` for a named operation (None without a name); ``ValueError`` when
    an operation of that kind and name is still pending (Horovod's duplicate-name error)."""
    if name is None:
        return None
    full = f"{kind}.{name}"
    if any(pending.name == full for pending in _table().pending.values()):
        raise ValueError(f"hvd.{kind}(name={name!r}): an operation named {full!r} is already "
                         "pending; synchronize it first, or give each concurrent operation "
                         "its own name")
    return full


def submit(works: Sequence[Any], finish: Callable[[], Any], *, name: str | None = None) -> int:
    """Register work in flight and the step that completes it (``name``: from
    :func:`check_name`); returns the new handle."""
    table = _table()
    handle = table.next_id
    table.next_id += 1
    table.pending[handle] = _Pending(works=[w for w in works if w is not None], finish=finish,
                                     name=name)
    return handle


def _lookup(table: _Table, handle: int, what: str) -> _Pending:
    pending = table.pending.get(handle) if isinstance(handle, int) else None
    if pending is None:
        raise ValueError(f"hvd.{what}({handle!r}): not a handle of a pending operation (it was "
                         "already synchronized, or comes from another hvd.init() session); "
                         "synchronize each handle returned by an *_async call exactly once")
    return pending


def poll(handle: int) -> bool:
    """True when the operation behind ``handle`` has finished (``synchronize`` won't block)."""
    pending = _lookup(_table(), handle, "poll")
    return all(work.is_completed() for work in pending.works)


def synchronize(handle: int) -> Any:
    """Wait for the operation behind ``handle`` and return its result (a tensor, or a tuple
    of tensors for ``alltoall`` with splits, or a list for the grouped operations)."""
    table = _table()
    pending = _lookup(table, handle, "synchronize")
    del table.pending[handle]
    for work in pending.works:
        work.wait()
    return pending.finish()
