"""Accelerate's ``accelerate.commands.estimate`` module path: estimate_command_parser,
estimate_command (``accel estimate-memory`` for a local model; Hub repo ids are refused),
add_timm_hub_prefix.

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
    from ..compat.commands_tools import (
        add_timm_hub_prefix as add_timm_hub_prefix,
    )
    from ..compat.commands_tools import (
        estimate_command as estimate_command,
    )
    from ..compat.commands_tools import (
        estimate_command_parser as estimate_command_parser,
    )
