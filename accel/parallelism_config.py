"""Accelerate's ``accelerate.parallelism_config`` module path: ParallelismConfig.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.parallelism_config import ParallelismConfig
    >>> ParallelismConfig().total_size
    1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


def __getattr__(name: str) -> Any:
    from .compat.paths import resolve  # on first use: importing the path costs nothing
    return resolve(__name__, name, globals())


def __dir__() -> list[str]:
    from .compat.paths import names
    return names(__name__)


if TYPE_CHECKING:  # pragma: no cover
    from .config.parallelism import ParallelismConfig as ParallelismConfig
