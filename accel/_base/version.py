"""accel's version, in a module of its own (layer L0).

Code below the package root (the checkpoint manifest, ``accel env``) reads it from here, so that
nothing has to import ``accel/__init__.py`` upward; ``accel.__version__`` re-exports it.

Example:
    >>> from accel._base.version import __version__
    >>> __version__
    '0.1.0'
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"  # keep equal to pyproject.toml's [project] version
