"""XLA devices through torch_xla and PJRT (TPU, or PJRT CPU for tests). Imported lazily.

XLA tensors are lazy: operations build a graph that runs when the step is marked
(``torch_xla.sync()``, formerly ``xm.mark_step()``) or when a value is read. ``synchronize``
marks the step and waits for the device.

Detection only looks at ``PJRT_DEVICE`` and whether torch_xla is installed, without importing
it: importing torch_xla sets ``PJRT_DEVICE=CPU`` in the environment when it is unset, which would
turn every later detection into "XLA".

Example:
    >>> XLADevice.kind, XLADevice.dist_backend
    ('xla', 'xla')
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from .. import env
from .._base import optional as _optional
from .base import Device

__all__ = ["XLADevice", "mark_step", "seed_from_tensor", "seed_to_tensor"]

_UINT64 = 1 << 64
_INT64_MAX = (1 << 63) - 1


def seed_to_tensor(seed: int) -> torch.Tensor:
    """Store an unsigned 64-bit XLA RNG seed in an int64 tensor (same bits, two's complement).

    XLA's seed walks the whole uint64 range, so ``torch.tensor(seed, dtype=torch.int64)`` would
    overflow for about half of the states.

    Example:
        >>> seed_from_tensor(seed_to_tensor(2**64 - 5)) == 2**64 - 5
        True
    """
    seed = int(seed)
    if not 0 <= seed < _UINT64:
        raise ValueError(f"an XLA RNG seed is an unsigned 64-bit integer, got {seed}")
    return torch.tensor(seed - _UINT64 if seed > _INT64_MAX else seed, dtype=torch.int64)


def seed_from_tensor(value: torch.Tensor | int) -> int:
    """Inverse of ``seed_to_tensor``; also accepts a plain non-negative int."""
    return int(value) % _UINT64


def _torch_xla() -> ModuleType:
    return _optional.require("torch_xla", extra="xla")


def _xm() -> ModuleType:
    return _optional.require("torch_xla.core.xla_model", extra="xla")


def mark_step() -> None:
    """Cut the lazy XLA graph here and run it (``torch_xla.sync``; ``mark_step`` before 2.6)."""
    txla = _torch_xla()
    if hasattr(txla, "sync"):  # xm.mark_step() is deprecated since torch_xla 2.6
        txla.sync()
    else:
        _xm().mark_step()


class XLADevice(Device):
    kind = "xla"
    dist_backend = "xla"

    @classmethod
    def available(cls) -> bool:
        # torch_xla installed is not enough: PJRT_DEVICE says the user wants XLA.
        return env.pjrt_device() is not None and _optional.is_available("torch_xla")

    @classmethod
    def count(cls) -> int:
        if not cls.available():
            return 0
        runtime = _optional.require("torch_xla.runtime", extra="xla")
        return int(runtime.addressable_device_count())

    @classmethod
    def names(cls) -> list[str]:
        return [f"XLA (PJRT {env.pjrt_device() or '?'})"]

    def torch_device(self, local_rank: int) -> torch.device:
        # Under PJRT every process addresses its own device(s) as xla:0.., so local_rank is
        # not an index here.
        txla = _torch_xla()
        if hasattr(txla, "device"):  # torch_xla >= 2.6; xm.xla_device() is deprecated
            return torch.device(txla.device())
        return torch.device(_xm().xla_device())

    def batch_hook(self) -> Callable[[], None] | None:
        return mark_step  # cut the lazy graph per batch (evaluation, accumulation micro-steps)

    def synchronize(self) -> None:
        mark_step()
        _xm().wait_device_ops()

    def rng_state(self) -> dict[str, Any] | None:
        return {"xla_seed": seed_to_tensor(_xm().get_rng_state())}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        if "xla_seed" not in state:
            raise KeyError(f"XLA RNG state needs the key 'xla_seed'; got keys {sorted(state)}")
        _xm().set_rng_state(seed_from_tensor(state["xla_seed"]))

    def manual_seed(self, seed: int) -> None:
        _xm().set_rng_state(int(seed) % _UINT64)

    def describe(self, world_size: int) -> str:
        return f"XLA (PJRT {env.pjrt_device()}), {world_size} process(es)"
