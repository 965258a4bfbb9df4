"""Let collective worker threads finish before the process group or the interpreter ends.

A backend's worker thread (gloo's work loop, nccl's watchdog) drops its last reference to a
finished collective a moment *after* the collective has returned to Python. Dropping a tensor
that has a Python object takes the GIL. If the interpreter has begun finalising by then, the
thread is ended inside a C++ destructor and the whole process aborts with "terminate called
without an active exception" (SIGABRT) even though the script finished. Plain
``torch.distributed`` scripts hit this at exit (about one run in five of a small DDP script on a
busy two-core machine). Destroying the group at that moment is no better: the group's destructor
joins the worker, which waits for the GIL the destroying thread holds.

``settle()`` releases the GIL and waits, bounded, until no other thread of this process is
running or runnable, so a worker in that window gets to finish. It reads thread states from
``/proc`` (Linux); elsewhere it sleeps a short fixed time instead.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["busy_threads", "settle", "thread_state"]

_TASKS = "/proc/self/task"


def busy_threads() -> list[int] | None:
    """Thread ids of this process, other than the caller's, that are running or runnable
    (``None`` where ``/proc`` is not available)."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    me = threading.get_native_id()
    busy = []
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"{_TASKS}/{tid}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # the thread ended meanwhile
            continue
        if thread_state(stat) == "R":
            busy.append(int(tid))
    return busy


def thread_state(stat: bytes) -> str:
    """The state letter of a ``/proc/<pid>/task/<tid>/stat`` line (``"R"`` running or runnable,
    ``"S"`` sleeping, ...); tests/unit/distributed/health/test_pins.py pins it on this kernel.

    Example:
        >>> thread_state(b"12 (a) b (c) S 1 12 12 0 -1")
        'S'
    """
    # "pid (comm) state ...": comm may contain spaces or parentheses, so split after the last ')'
    end = stat.rfind(b")")
    return stat[end + 2: end + 3].decode("ascii", "replace")


def settle(limit: float = 0.5, quiet_samples: int = 2, interval: float = 0.001) -> bool:
    """Release the GIL until every other thread has been idle for ``quiet_samples`` checks in a
    row, or ``limit`` seconds have passed. Returns whether the process went quiet."""
    deadline = time.monotonic() + limit
    quiet = 0
    while True:
        time.sleep(interval)  # releases the GIL: a worker waiting for it runs now
        busy = busy_threads()
        if busy is None:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
            return False
        quiet = quiet + 1 if not busy else 0
        if quiet >= quiet_samples:
            return True
        if time.monotonic() >= deadline:
            return False
