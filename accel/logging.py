"""Accelerate's ``accelerate.logging`` module path: get_logger, MultiProcessAdapter.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.logging import get_logger
    >>> get_logger("my_script").name
    'my_script'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compat import paths as _paths


def __getattr__(name: str) -> Any:
    return _paths.resolve(__name__, name, globals())


def __dir__() -> list[str]:
    return _paths.names(__name__)


if TYPE_CHECKING:  # pragma: no cover
    from .env.log import *  # noqa: F403
