"""Accelerate's ``accelerate.utils.launch`` module path: prepare_simple_launcher_cmd_env,
prepare_multi_gpu_env (answered by ``accel launch``'s own resolution; its other names are
internal to ``accelerate launch``: refused).

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
    from ..compat.commands_launch import (
        prepare_multi_gpu_env as prepare_multi_gpu_env,
    )
    from ..compat.commands_launch import (
        prepare_simple_launcher_cmd_env as prepare_simple_launcher_cmd_env,
    )
