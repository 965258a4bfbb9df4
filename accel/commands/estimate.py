"""Accelerate's ``accelerate.commands.estimate`` module path
(refused: ``accel estimate-memory`` instead).

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from ..compat.paths import resolve  # on first use: importing the path costs nothing
    return resolve(__name__, name, globals())


def __dir__() -> list[str]:
    from ..compat.paths import names
    return names(__name__)
