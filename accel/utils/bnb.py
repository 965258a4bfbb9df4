"""Accelerate's ``accelerate.utils.bnb``: bitsandbytes quantization, which accel refuses (each
name imports as a stand-in that raises, saying so, when used).

Example:
    >>> import accel.utils.bnb as bnb
    >>> hasattr(bnb, "load_and_quantize_model")
    True
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from ..compat.paths import resolve  # on first use: importing the path costs nothing
    return resolve(__name__, name, globals())


def __dir__() -> list[str]:
    from ..compat.paths import names
    return names(__name__)
