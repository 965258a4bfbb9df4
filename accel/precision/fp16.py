"""float16 autocast with ``torch.amp.GradScaler`` (fp32 master weights)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..config.settings import AutocastKwargs, GradScalerKwargs, PrecisionType
from .autocast import AutocastPrecision

__all__ = ["FP16Precision"]


class FP16Precision(AutocastPrecision):
    mode = PrecisionType.FP16
    dtype = torch.float16

    def __init__(self, device: torch.device, autocast: AutocastKwargs | None = None,
                 scaler_kwargs: GradScalerKwargs | None = None) -> None:
        super().__init__(device, autocast)
        kw = (scaler_kwargs or GradScalerKwargs()).to_kwargs()
        self._scaler = torch.amp.GradScaler(device.type, **kw)
        self._unscaled: set[int] = set()

    @property
    def scaler(self) -> torch.amp.GradScaler:
        return self._scaler

    def check_model(self, model: nn.Module) -> None:
        bad = [name for name, p in model.named_parameters()
               if p.requires_grad and p.dtype == torch.float16]
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise ValueError(
                f"mixed_precision='fp16' needs float32 trainable parameters, but {shown} are "
                "float16 (the GradScaler cannot unscale fp16 gradients). Keep the model in "
                "float32 (model.float()) and let autocast use fp16, or use mixed_precision='bf16'")

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scaler.scale(loss)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._unscaled:
            return
        self._scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        before = self._scaler.get_scale()
        self._scaler.step(optimizer, **kwargs)
        self._scaler.update()
        self._unscaled.discard(id(optimizer))
        # GradScaler lowers the scale exactly when it found inf/nan and skipped the step.
        return not self._scaler.get_scale() < before

    def state_dict(self) -> dict[str, Any]:
        return dict(self._scaler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self._scaler.load_state_dict(state)
