"""Horovod's exceptions (``horovod.common.exceptions``), under the same names.

``HorovodInternalError`` marks a failed collective (a peer was lost); ``HostsUpdatedInterrupt``
marks a change of the job's hosts. Under ``accel launch --max_restarts`` (torchrun's agent) both
end in the same way: the process exits, the agent restarts the whole worker group, and
``hvd.elastic.run`` resumes every worker from the last commit (see :mod:`accel.horovod.elastic`).

Example:
    >>> import accel.horovod as hvd
    >>> issubclass(hvd.HorovodInternalError, RuntimeError)
    True
    >>> hvd.HostsUpdatedInterrupt(skip_sync=True).skip_sync
    True
"""

from __future__ import annotations

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]


class HorovodInternalError(RuntimeError):
    """A collective failed, typically because a peer process was lost."""


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed; ``skip_sync``: the state need not be synchronised again."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__(f"the job's hosts changed (skip_sync={skip_sync})")
        self.skip_sync = skip_sync
