"""One process on one device: place the model, nothing to synchronise."""

from __future__ import annotations

from torch import nn

from .base import Strategy, SyncSetting

__all__ = ["SingleDeviceStrategy"]


class SingleDeviceStrategy(Strategy):
    name = "single"
    replicates_model = True

    def wrap_model(self, model: nn.Module, sync_batchnorm: SyncSetting = False) -> nn.Module:
        return self._convert_and_place(model, sync_batchnorm)
