"""The CPU device."""

from __future__ import annotations

import platform

import torch

from .base import Device

__all__ = ["CPUDevice"]


class CPUDevice(Device):
    kind = "cpu"
    dist_backend = "gloo"

    @classmethod
    def available(cls) -> bool:
        return True

    @classmethod
    def count(cls) -> int:
        return 1

    @classmethod
    def names(cls) -> list[str]:
        return [platform.processor() or platform.machine() or "CPU"]

    def torch_device(self, local_rank: int) -> torch.device:
        return torch.device("cpu")
