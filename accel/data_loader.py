"""Accelerate's ``accelerate.data_loader``: prepare_data_loader and the loader classes.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.data_loader import skip_first_batches
    >>> callable(skip_first_batches)
    True
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
    from .compat.data_loader import *  # noqa: F403
