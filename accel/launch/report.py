"""Worker error files and the launcher's one ROOT CAUSE report.

Workers write torchelastic's error-file JSON (``TORCHELASTIC_ERROR_FILE``; the format of
``torch.distributed.elastic.multiprocessing.errors.ErrorHandler``) with extra fields under
``extraInfo.accel`` (rank, host, pid, nanosecond time). The launcher turns torchelastic's
``ChildFailedError.failures`` into ``Failure`` records and prints exactly one ROOT CAUSE block;
the other ranks (stopped by the agent, or failing because a peer disappeared) are folded into
one line.

Example:
    >>> f = Failure(rank=1, local_rank=1, pid=42, exitcode=1, host="n1",
    ...             message="ValueError: boom", traceback="Traceback ...\\nValueError: boom")
    >>> print(format_failure_report([f]).splitlines()[1])
    ROOT CAUSE: rank 1 (local rank 1) on host n1, pid 42, exit code 1
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import traceback as tb_module
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Failure", "failure_from_error_data", "format_failure_report", "root_failure",
           "user_traceback", "write_error_file"]

_RULE = "=" * 72
#: What torchelastic puts in ``error_file_data`` when a worker wrote no error file.
_NO_ERROR_FILE = "<NONE>"
#: Messages of errors that are usually a consequence of another rank's failure.
_PEER_PATTERNS = (
    "connection closed by peer", "connection reset by peer", "broken pipe", "distbackenderror",
    "distnetworkerror", "communicator was aborted", "connection refused", "socket closed",
    "watchdog caught collective operation timeout",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    """One failed worker, as the launcher reports it."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int
    host: str
    message: str
    traceback: str | None = None
    time_ns: int = 0

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def secondary(self) -> bool:
        """Killed by a signal without a traceback, or failed because a peer went away."""
        if self.traceback is None:
            return True
        text = self.message.lower()
        return any(pattern in text for pattern in _PEER_PATTERNS)

    def summary(self, role: str = "") -> str:
        """``role``: what the rank is in the job (a parameter server, a worker), if anything."""
        what = self.signal_name or f"exit code {self.exitcode}"
        first = (self.message.strip().splitlines() or [""])[0]
        first = first if len(first) <= 120 else first[:117] + "..."
        detail = f": {first}" if self.traceback is not None else ""
        return f"rank {self.rank} ({role + ', ' if role else ''}pid {self.pid}, {what}{detail})"


def user_traceback(exc: BaseException, internal: Sequence[str] = ()) -> str:
    """``exc``'s traceback without the leading frames of launcher plumbing.

    Leading frames whose file is ``runpy`` or one of ``internal`` are dropped, so the report
    starts at the user's code.
    """
    skip = tuple(internal) + ("<frozen runpy>", os.path.join("", "runpy.py"))
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and \
            tb.tb_frame.f_code.co_filename.endswith(skip):
        tb = tb.tb_next
    return "".join(tb_module.format_exception(type(exc), exc, tb))


def write_error_file(exc: BaseException, *, path: str | None, extra: Mapping[str, Any],
                     traceback_text: str | None = None) -> bool:
    """Write ``exc`` (with its traceback) in torchelastic's error-file format; False if no path."""
    if not path:
        return False
    now = time.time_ns()
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": traceback_text or "".join(tb_module.format_exception(exc)),
                "timestamp": str(now // 1_000_000_000),
                "accel": {"host": socket.gethostname(), "pid": os.getpid(), "time_ns": now,
                          **dict(extra)},
            },
        }
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)  # the agent never sees a half-written file
    return True


def failure_from_error_data(rank: int, *, local_rank: int, pid: int, exitcode: int,
                            data: Mapping[str, Any] | None, fallback_time_ns: int) -> Failure:
    """Build a ``Failure`` from an error file's JSON (``None``/empty when there was none)."""
    message = (data or {}).get("message")
    if isinstance(message, Mapping):
        info = message.get("extraInfo") or {}
        accel = info.get("accel") or {}
        stamp = accel.get("time_ns") or int(info.get("timestamp") or 0) * 1_000_000_000
        return Failure(rank=rank, local_rank=local_rank, pid=int(accel.get("pid") or pid),
                       exitcode=exitcode, host=str(accel.get("host") or socket.gethostname()),
                       message=str(message.get("message", "")),
                       traceback=str(info.get("py_callstack") or message.get("message", "")),
                       time_ns=int(stamp or fallback_time_ns))
    if isinstance(message, str) and message and message != _NO_ERROR_FILE:
        return Failure(rank=rank, local_rank=local_rank, pid=pid, exitcode=exitcode,
                       host=socket.gethostname(), message=message, traceback=message,
                       time_ns=fallback_time_ns)
    text = (f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 and
            -exitcode in signal.Signals._value2member_map_ else f"exited with code {exitcode}")
    return Failure(rank=rank, local_rank=local_rank, pid=pid, exitcode=exitcode,
                   host=socket.gethostname(), message=text, traceback=None,
                   time_ns=fallback_time_ns)


def root_failure(failures: Sequence[Failure]) -> Failure:
    """The root cause: the earliest real error; peer-loss errors and signals rank after it.

    Among workers without a traceback, one killed by SIGTERM (what the agent sends to stop the
    others) ranks after one that died some other way (SIGKILL by the OOM killer, SIGSEGV, ...).
    """
    def category(f: Failure) -> int:
        if not f.secondary:
            return 0  # a real error with a traceback
        if f.traceback is None and f.exitcode != -int(signal.SIGTERM):
            return 1  # died on its own without Python: SIGKILL, SIGSEGV, os._exit(n)
        return 2 if f.traceback is not None else 3  # lost a peer; stopped by the agent

    return min(failures, key=lambda f: (category(f), f.time_ns, f.rank))


def format_failure_report(failures: Sequence[Failure], name: str = "",
                          roles: Mapping[int, str] | None = None) -> str:
    """One ROOT CAUSE block (rank, host, pid, traceback) plus one line for the other ranks.

    ``roles``: what each rank is, by rank (a parameter-server job's servers and workers, see
    :func:`accel.env.rank_roles`), named beside the rank.
    """
    if not failures:
        raise ValueError("format_failure_report() needs at least one failure")
    roles = roles or {}
    root = root_failure(failures)
    what = root.signal_name or f"exit code {root.exitcode}"
    role = f", {roles[root.rank]}" if root.rank in roles else ""
    lines = [_RULE,
             f"ROOT CAUSE: rank {root.rank} (local rank {root.local_rank}{role}) on host "
             f"{root.host}, pid {root.pid}, {what}", "-" * len(_RULE)]
    if root.traceback is not None:
        lines.append(root.traceback.rstrip("\n"))
    else:
        lines.append(f"{root.message} (no Python traceback: the process was killed or crashed "
                     "in native code; its last output is above)")
    if root.traceback is not None and root.secondary:
        lines.append("This error means that a peer process went away: the real failure is "
                     "probably on another\nmachine (see that machine's report), or a peer "
                     "was killed from outside (OOM killer, scheduler).")
    lines.append(_RULE)
    others = sorted((f for f in failures if f is not root), key=lambda f: f.rank)
    if others:
        lines.append(f"{len(others)} other rank(s) stopped as a consequence: "
                     + "; ".join(f.summary(roles.get(f.rank, "")) for f in others))
    if name:
        lines.append(f"{name} failed; see the ROOT CAUSE above")
    return "\n".join(lines)
