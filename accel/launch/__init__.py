"""Starting jobs: the ``accel`` command line, ``notebook_launcher``, ``debug_launcher`` and
``spawn``.

Names are imported lazily: ``accel --help`` imports this package and must not import torch.

Example:
    >>> from accel.launch import notebook_launcher
    >>> notebook_launcher.__name__
    'notebook_launcher'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["debug_launcher", "main", "notebook_launcher", "spawn"]

_EXPORTS = {
    "debug_launcher": "accel.launch.notebook",
    "notebook_launcher": "accel.launch.notebook",
    "main": "accel.launch.cli",
    "spawn": "accel.launch.spawning",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover
    from .cli import main
    from .notebook import debug_launcher, notebook_launcher
    from .spawning import spawn
