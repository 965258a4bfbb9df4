"""The interface every device kind implements.

Example:
    >>> from accel.device import select_device
    >>> select_device("cpu").kind
    'cpu'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Device"]


class Device(ABC):
    """One kind of hardware: how to detect it, bind a rank to it, and seed it."""

    kind: str = ""
    #: torch.distributed backend used for this kind.
    dist_backend: str = ""

    @classmethod
    @abstractmethod
    def available(cls) -> bool:
        """True when this kind can be used here. Must not initialise CUDA."""

    @classmethod
    @abstractmethod
    def count(cls) -> int:
        """Number of devices of this kind visible to this process (0 if none)."""

    @classmethod
    def names(cls) -> list[str]:
        """Human-readable names of the visible devices, for reports."""
        return [cls.kind.upper()] * max(cls.count(), 1)

    @classmethod
    def free_memory(cls, index: int) -> int | None:
        """Bytes free on device ``index`` of this kind; None when the kind cannot tell.

        Unlike ``available``/``count``, this may initialise the device (big-model placement
        asks it only when about to use the device).
        """
        return None

    @abstractmethod
    def torch_device(self, local_rank: int) -> torch.device:
        """The device that the process with this local rank uses."""

    def bind(self, device: torch.device) -> None:
        """Make ``device`` current for this process (before the process group starts)."""

    def synchronize(self) -> None:
        """Wait for queued work on the device."""

    def rng_state(self) -> dict[str, Any] | None:
        """Device RNG state as tensors (None when the kind has none of its own)."""
        return None

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what ``rng_state`` returned."""

    def manual_seed(self, seed: int) -> None:
        """Seed this device's generators."""

    def supports_bf16(self) -> bool:
        return True

    def supports_fp16_scaler(self) -> bool:
        """Whether ``torch.amp.GradScaler`` works here (fp16 mixed precision needs it)."""
        return True

    def batch_hook(self) -> Callable[[], None] | None:
        """What a prepared loader calls after producing each batch; None when nothing.

        Lazy devices cut their graph per batch here (XLA's ``mark_step``). A device without a
        hook returns None, so the loader's hot path costs nothing on it.
        """
        return None

    def describe(self, world_size: int) -> str:
        """One line such as ``2x CUDA (Tesla T4)`` or ``CPU, 2 processes, gloo``."""
        return f"{self.kind.upper()}, {world_size} process(es), {self.dist_backend}"
