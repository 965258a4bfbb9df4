"""Accelerate's ``accelerate.commands.to_fsdp2`` module path: to_fsdp2_command_parser,
to_fsdp2_command, convert_config_to_fsdp2 (a config file's FSDP1 keys to FSDP2's).

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
        convert_config_to_fsdp2 as convert_config_to_fsdp2,
    )
    from ..compat.commands_tools import (
        to_fsdp2_command as to_fsdp2_command,
    )
    from ..compat.commands_tools import (
        to_fsdp2_command_parser as to_fsdp2_command_parser,
    )
