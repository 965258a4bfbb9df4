"""Accelerate's ``accelerate.local_sgd`` module path: LocalSGD.

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).

Example:
    >>> from accel.local_sgd import LocalSGD
    >>> LocalSGD.__name__
    'LocalSGD'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compat import paths as _paths


def __getattr__(name: str) -> Any:
    return _paths.resolve(__name__, name, globals())


def __dir__() -> list[str]:
    return _paths.names(__name__)


if TYPE_CHECKING:  # pragma: no cover
    from .accelerator.local_sgd import *  # noqa: F403
