"""What torchrun's elastic agent says when it restarts the workers, read from its log records.

torchelastic announces a restart only in an INFO record of its agent's logger, and does not log
the failures of the attempt it restarts: they are in the local ``run_result`` of the agent's
monitoring loop (``SimpleElasticAgent._invoke_run``), the frame that emits that record. This
module is the one place that knows those internals: the logger names, the record's text and
arguments, and the name of the local. Each is pinned against the installed torch by
tests/unit/distributed/health/test_pins.py, so a torch upgrade that changes them fails that test
rather than silently dropping a report from a user's job.

It imports no torch (``accel launch`` imports it lazily, after torch is imported anyway).

Example:
    >>> import logging
    >>> record = logging.LogRecord(AGENT_LOGGER, logging.INFO, "api.py", 1,
    ...     "[%s] Worker group %s. %s/%s attempts left; will restart worker group",
    ...     ("default", "FAILED", 3, 3), None)
    >>> restart = restart_of(record, failures=None)
    >>> restart.state, restart.left, restart.total, restart.number
    ('FAILED', 3, 3, 1)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["AGENT_LOGGER", "RESTART_TEXT", "RESULT_LOCAL", "WORKERS_LOGGER", "Restart",
           "RestartNotice", "attempt_failures", "quiet_agent_logs", "restart_of"]

#: The logger of ``torch.distributed.elastic.agent.server.api`` (the agent's monitoring loop).
AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"
#: The logger of ``torch.distributed.elastic.multiprocessing.api``: one ERROR line per failed
#: worker, which accel's ROOT CAUSE report replaces.
WORKERS_LOGGER = "torch.distributed.elastic.multiprocessing.api"
#: The end of the agent's restart record ``"[%s] Worker group %s. %s/%s attempts left; will
#: restart worker group"`` (role, state name, restarts left, max restarts).
RESTART_TEXT = "will restart worker group"
#: The local of ``SimpleElasticAgent._invoke_run`` holding the attempt's ``RunResult``.
RESULT_LOCAL = "run_result"
#: Frames walked up from the filter to the agent's loop (about 6 with the standard logging).
_DEPTH = 30


@dataclass(frozen=True, kw_only=True, slots=True)
class Restart:
    """One restart announced by the agent: the worker group's state, the restarts left before
    this one (of ``total``, which is ``--max-restarts``) and the failed attempt's
    ``{rank: ProcessFailure}`` (None when its frame was not found)."""

    state: str
    left: int
    total: int
    failures: Mapping[Any, Any] | None = None

    @property
    def number(self) -> int:
        """Which restart this is, counting from 1."""
        return self.total - self.left + 1


def restart_of(record: logging.LogRecord, *, failures: Mapping[Any, Any] | None
               ) -> Restart | None:
    """The restart that ``record`` announces (with the attempt's ``failures``), or None for
    any other record."""
    args = record.args if isinstance(record.args, tuple) else ()
    if RESTART_TEXT not in str(record.msg) or len(args) != 4:
        return None  # (the 3-argument variant is a membership change, not a failure)
    _, state, left, total = args
    try:
        return Restart(state=str(state), left=int(str(left)), total=int(str(total)),
                       failures=failures)
    except ValueError:
        return None


def attempt_failures(frame: FrameType | None, *, depth: int = _DEPTH
                     ) -> Mapping[Any, Any] | None:
    """The failures (``{rank: ProcessFailure}``) of the attempt being restarted, read from the
    ``run_result`` local of the nearest frame at or above ``frame`` that has one (best effort:
    None when none is found within ``depth`` frames)."""
    for _ in range(depth):
        if frame is None:
            break
        result = frame.f_locals.get(RESULT_LOCAL)
        failures = getattr(result, "failures", None) if result is not None else None
        if isinstance(failures, Mapping):
            return failures
        frame = frame.f_back
    return None


#: Called with each restart the agent announces.
OnRestart = Callable[[Restart], None]


class RestartNotice(logging.Filter):
    """A filter on the agent's logger: calls ``on_restart`` for each restart record, and keeps
    WARNING and up (every record with ``debug``)."""

    def __init__(self, *, debug: bool, on_restart: OnRestart) -> None:
        super().__init__()
        self.debug = debug
        self.on_restart = on_restart

    def filter(self, record: logging.LogRecord) -> bool:
        if RESTART_TEXT in str(record.msg):  # cheap test first: the filter sees every record
            restart = restart_of(record, failures=attempt_failures(sys._getframe(1)))
            if restart is not None:
                self.on_restart(restart)
        return self.debug or record.levelno >= logging.WARNING


def quiet_agent_logs(on_restart: OnRestart, *, debug: bool) -> RestartNotice:
    """Quiet torchelastic's per-worker ERROR lines (kept with ``debug``) and watch its agent's
    logger for restarts, replacing the filter of an earlier launch in this process."""
    workers = logging.getLogger(WORKERS_LOGGER)
    workers.setLevel(logging.INFO if debug else logging.CRITICAL)
    agent = logging.getLogger(AGENT_LOGGER)
    agent.setLevel(logging.INFO)  # the restart record is INFO; the filter drops the rest
    for old in [f for f in agent.filters if isinstance(f, RestartNotice)]:
        agent.removeFilter(old)  # a launch before this one in the process (another job)
    notice = RestartNotice(debug=debug, on_restart=on_restart)
    agent.addFilter(notice)
    return notice
