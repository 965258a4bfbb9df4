"""accel's version, in a module of its own (layer L0).

Code below the package root (the checkpoint manifest, ``accel env``) reads it from here, so that
nothing has to import ``accel/__init__.py`` upward; ``accel.__version__`` re-exports it.

Example:
    >>> from accel._base.version import __version__
    >>> __version__
    '1.0.0'
"""

from __future__ import annotations

__all__ = ["__version__"]

#: Starts at 1.0 on purpose: scripts written for Accelerate gate code on its version
#: (diffusers' trainers register their checkpoint hooks only ``if accelerate.__version__ >=
#: "0.16.0"``); after the import swap they read accel's, which must pass the gates of the API
#: accel has. Keep equal to pyproject.toml's [project] version.
__version__ = "1.0.0"
