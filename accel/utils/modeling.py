"""Accelerate's ``accelerate.utils.modeling``: big-model sizes, device maps, loading.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.utils.modeling import convert_file_size_to_int
    >>> convert_file_size_to_int("1KB")
    1000
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
    from ..big_modeling import *  # noqa: F403
