"""Accelerate's ``accelerate.utils.imports`` module path: the is_*_available() probes.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.utils.imports import is_pytest_available
    >>> is_pytest_available()
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
    from ..device.availability import *  # noqa: F403
