"""Accelerate's ``accelerate.commands.tpu`` module path: tpu_command_parser,
tpu_command_launcher (prints the gcloud command with ``--debug``; accel does not run gcloud).

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
        tpu_command_launcher as tpu_command_launcher,
    )
    from ..compat.commands_tools import (
        tpu_command_parser as tpu_command_parser,
    )
