"""Accelerate's ``accelerate.commands.config.config_args`` module path: BaseConfig,
ClusterConfig, load_config_from_file (SageMakerConfig is refused).

A lazy re-export (names resolve on first use through :mod:`accel.compat.paths`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


def __getattr__(name: str) -> Any:
    from ...compat.paths import resolve  # on first use: importing the path costs nothing
    return resolve(__name__, name, globals())


def __dir__() -> list[str]:
    from ...compat.paths import names
    return names(__name__)


if TYPE_CHECKING:  # pragma: no cover
    from ...compat.commands_config import (
        BaseConfig as BaseConfig,
    )
    from ...compat.commands_config import (
        ClusterConfig as ClusterConfig,
    )
    from ...compat.commands_config import (
        load_config_from_file as load_config_from_file,
    )
