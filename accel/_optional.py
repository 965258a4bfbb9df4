"""Optional dependencies: imported on first use, with an error naming the pip extra."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["is_available", "require"]


def is_available(module: str) -> bool:
    """True when ``module`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``ModuleNotFoundError`` saying how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{module} is needed for this feature but is not installed; "
            f"install it with `pip install 'accel[{extra}]'`"
        ) from exc
