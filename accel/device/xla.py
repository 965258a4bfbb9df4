"""XLA devices through torch_xla and PJRT (TPU, or PJRT CPU for tests). Imported lazily."""

from __future__ import annotations

from typing import Any

import torch

from .. import _optional, env
from .base import Device

__all__ = ["XLADevice"]


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
        xm = _optional.require("torch_xla.core.xla_model", extra="xla")
        return xm.xla_device()

    def synchronize(self) -> None:
        xm = _optional.require("torch_xla.core.xla_model", extra="xla")
        xm.mark_step()
        xm.wait_device_ops()

    def rng_state(self) -> dict[str, Any] | None:
        xm = _optional.require("torch_xla.core.xla_model", extra="xla")
        return {"xla_seed": torch.tensor(int(xm.get_rng_state()), dtype=torch.int64)}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        xm = _optional.require("torch_xla.core.xla_model", extra="xla")
        xm.set_rng_state(int(state["xla_seed"]))

    def manual_seed(self, seed: int) -> None:
        xm = _optional.require("torch_xla.core.xla_model", extra="xla")
        xm.set_rng_state(seed)

    def describe(self, world_size: int) -> str:
        return f"XLA (PJRT {env.pjrt_device()}), {world_size} process(es)"
