"""Process hygiene on Linux: workers die with their agent, and nothing outlives the launcher.

- ``set_parent_death_signal``: ``prctl(PR_SET_PDEATHSIG)`` so a worker is killed when the process
  that started it (torchrun's agent, i.e. ``accel launch``) dies, even by SIGKILL.
- ``become_subreaper``: ``prctl(PR_SET_CHILD_SUBREAPER)`` so orphaned grandchildren (DataLoader
  workers of a rank that was killed) are re-parented to the launcher instead of init;
  ``reap_children`` then terminates whatever is left when the job is over.

Both are no-ops (returning False) on other systems.

Example:
    >>> isinstance(child_pids(os.getpid()), list)
    True
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

__all__ = ["become_subreaper", "child_pids", "reap_children", "set_parent_death_signal"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0)) == 0


def set_parent_death_signal(expected_parent: int | None = None,
                            sig: signal.Signals = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits.

    If ``expected_parent`` is given and the parent is already gone (re-parented), exit at once:
    the death signal would never come.
    """
    if not _prctl(_PR_SET_PDEATHSIG, int(sig)):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(128 + int(sig))  # the agent died before we armed the signal
    return True


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux >= 3.4)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def child_pids(parent: int) -> list[int]:
    """PIDs whose parent is ``parent``, read from ``/proc`` (empty where there is no /proc)."""
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(parent) and fields[0] != "Z":
            found.append(int(entry))
    return found


def _collect_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap_children(grace: float = 5.0) -> list[int]:
    """Terminate (SIGTERM, then SIGKILL after ``grace`` s) every remaining child; return them.

    Only call this when the job is over: it waits for *any* child of this process.
    """
    me = os.getpid()
    killed: list[int] = []
    deadline = time.monotonic() + grace
    give_up = deadline + 5.0  # a process stuck in the kernel (state D) cannot be helped
    sig = signal.SIGTERM
    while True:
        _collect_zombies()
        pids = child_pids(me)
        if not pids or time.monotonic() > give_up:
            return killed
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.05)
