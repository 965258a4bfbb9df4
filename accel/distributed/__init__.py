"""Process context, process group and collectives."""

from __future__ import annotations

from .context import ProcessContext
from .group import DEFAULT_TIMEOUT, ProcessGroupHandle, build_context, start_process_group
from .ops import REDUCTIONS, CollectiveMismatchError, Communicator

__all__ = [
    "DEFAULT_TIMEOUT",
    "REDUCTIONS",
    "CollectiveMismatchError",
    "Communicator",
    "ProcessContext",
    "ProcessGroupHandle",
    "build_context",
    "start_process_group",
]
