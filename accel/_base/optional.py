"""Optional dependencies: imported on first use, with an error naming the pip extra."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["check_installed", "is_available", "require"]


def is_available(module: str) -> bool:
    """True when ``module`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _missing(module: str, extra: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"{module} is needed for this feature but is not installed; "
        f"install it with `pip install 'accel[{extra}]'`"
    )


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``ModuleNotFoundError`` saying how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise _missing(module, extra) from exc


def check_installed(module: str, extra: str) -> None:
    """Raise ``require``'s error when ``module`` is not installed, without importing it (for
    checks on every rank of packages that are slow to import, e.g. ``wandb``).

    Example:
        >>> check_installed("json", "none")
        >>> check_installed("no_such_package_here", "demo")
        Traceback (most recent call last):
        ...
        ModuleNotFoundError: no_such_package_here is needed ... `pip install 'accel[demo]'`
    """
    if not is_available(module):
        raise _missing(module, extra)
