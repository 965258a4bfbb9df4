"""Accelerate's ``accelerate.utils.memory``: find_executable_batch_size, release_memory, ...

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.utils.memory import should_reduce_batch_size
    >>> should_reduce_batch_size(RuntimeError("CUDA out of memory."))
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


def __getattr__(name: str) -> Any:
    from ..compat.paths import resolve  # on first use: importing the path costs nothing
    return resolve(__name__, name, globals())


def __dir__() -> list[str]:
    from ..compat.paths import names
    return names(__name__)


if TYPE_CHECKING:  # pragma: no cover
    from ..run.memory import *  # noqa: F403
