"""Accelerate's ``accelerate.utils.imports``: the ``is_*_available()`` probes (defined in
``accel.availability``; none of them imports the package it asks about).

Example:
    >>> is_pytest_available()
    True
"""

from __future__ import annotations

from .. import availability
from ..availability import *  # noqa: F403 - the probes, defined (and listed) there

__all__ = list(availability.__all__)
