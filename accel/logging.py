"""Accelerate's ``accelerate.logging`` module path: get_logger, MultiProcessAdapter.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.logging import get_logger
    >>> get_logger("my_script").name
    'my_script'
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
    from .env.log import *  # noqa: F403
