"""Accelerate's ``accelerate.utils.environment`` module path: patch_environment,
clear_environment, purge_accelerate_environment, ...

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.utils.environment import clear_environment
    >>> callable(clear_environment)
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
    from ..compat.environment import *  # noqa: F403
