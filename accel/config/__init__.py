"""L0: plain settings dataclasses (kwargs handlers, data loader, project, FSDP/parallelism).

Example:
    >>> from accel.config import DataLoaderConfiguration
    >>> DataLoaderConfiguration().even_batches
    True
"""

from __future__ import annotations

from .settings import *  # noqa: F403
from .settings import __all__ as __all__
