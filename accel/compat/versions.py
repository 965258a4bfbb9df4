"""Accelerate's ``accelerate.utils.versions``: compare installed versions with a requirement.

Example:
    >>> from accel.utils.versions import compare_versions, is_torch_version
    >>> is_torch_version(">=", "2.0")
    True
    >>> compare_versions("2.1.0", "<", "2.10")  # versions, not strings
    True
"""

from __future__ import annotations

import importlib.metadata
import operator
from collections.abc import Callable
from typing import Any

__all__ = ["STR_OPERATION_TO_FUNC", "compare_versions", "is_torch_version"]

#: the comparison operators a requirement may use
STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
    "<=": operator.le, "<": operator.lt}


def _parse(version: str) -> Any:
    try:
        from packaging.version import Version
    except ImportError:  # torch vendors it
        from torch._vendor.packaging.version import Version  # type: ignore[assignment]
    return Version(version)


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """``library_or_version`` (an installed distribution's name, a version string or a parsed
    version) ``operation`` ``requirement_version``, compared as versions.

    Raises:
        ValueError: ``operation`` is not one of ``>``, ``>=``, ``==``, ``!=``, ``<=``, ``<``.
        importlib.metadata.PackageNotFoundError: no distribution of that name is installed.
    """
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"operation must be one of {list(STR_OPERATION_TO_FUNC)}, got "
                         f"{operation!r}")
    if isinstance(library_or_version, str):
        try:
            version = _parse(library_or_version)
        except ValueError:  # not a version: a distribution name (as Accelerate reads it)
            version = _parse(importlib.metadata.version(library_or_version))
    else:
        version = library_or_version
    return STR_OPERATION_TO_FUNC[operation](version, _parse(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    """The installed torch ``operation`` ``version`` (e.g. ``is_torch_version(">=", "2.4")``)."""
    return compare_versions(importlib.metadata.version("torch"), operation, version)
