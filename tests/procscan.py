"""Find processes through /proc (Linux): used by the drills that check for leftover processes."""

from __future__ import annotations

import os

__all__ = ["alive", "with_marker"]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def with_marker(marker: str) -> list[int]:
    """Processes (other than this one) whose command line mentions ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found
