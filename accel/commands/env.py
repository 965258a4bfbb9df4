"""Accelerate's ``accelerate.commands.env`` module path:
env_command_parser, env_command (``accel env``).

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).
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
    from ..compat.commands import (
        env_command as env_command,
    )
    from ..compat.commands import (
        env_command_parser as env_command_parser,
    )
