"""What Hugging Face Accelerate users import from ``accelerate.utils``.

The submodules carry Accelerate's module paths (``from accelerate.utils.operations import
gather`` becomes ``from accel.utils.operations import gather``). Every name resolves on first
use through :mod:`accel.compat.paths`, so ``import accel.utils`` imports nothing heavy.

Example:
    >>> import torch
    >>> from accel.utils import gather, set_seed
    >>> set_seed(0)
    >>> gather(torch.tensor([1, 2])).tolist()
    [1, 2]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


def __getattr__(name: str) -> Any:
    from ..compat.paths import resolve  # on first use: importing the path costs nothing
    return resolve(__name__, name, globals())


def __dir__() -> list[str]:
    from ..compat.paths import names
    return names(__name__)


if TYPE_CHECKING:  # pragma: no cover
    from ..compat.dataclasses import *  # noqa: F403
    from ..compat.environment import *  # noqa: F403
    from ..compat.operations import *  # noqa: F403
    from ..compat.other import *  # noqa: F403
    from ..compat.random import *  # noqa: F403
    from ..device.availability import *  # noqa: F403
