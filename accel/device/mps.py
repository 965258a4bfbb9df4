"""Apple's Metal (MPS) device: single process only."""

from __future__ import annotations

from typing import Any

import torch

from .base import Device

__all__ = ["MPSDevice"]


class MPSDevice(Device):
    kind = "mps"
    dist_backend = "gloo"

    @classmethod
    def available(cls) -> bool:
        backend = getattr(torch.backends, "mps", None)
        return bool(backend is not None and backend.is_available())

    @classmethod
    def count(cls) -> int:
        return 1 if cls.available() else 0

    def torch_device(self, local_rank: int) -> torch.device:
        return torch.device("mps")

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def supports_fp16_scaler(self) -> bool:
        return False  # GradScaler has no MPS implementation

    def manual_seed(self, seed: int) -> None:
        torch.mps.manual_seed(seed)

    def rng_state(self) -> dict[str, Any] | None:
        return {"mps": torch.mps.get_rng_state()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.mps.set_rng_state(state["mps"])

    def describe(self, world_size: int) -> str:
        return f"MPS (Apple GPU), {world_size} process(es)"
