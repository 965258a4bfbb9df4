"""The interface every mixed-precision mode implements.

A precision object owns everything that differs between modes: the forward context (autocast),
the forward wrapper that ``prepare()`` installs on a model and its removal, loss scaling in
backward, unscaling before clipping, the optimizer step (which the fp16 scaler may skip) and the
scaler's state for checkpoints.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from ..config.settings import AutocastKwargs, PrecisionType

__all__ = ["Precision", "remove_forward_wrapper"]

#: attribute that marks a forward installed by a precision object (holds the original forward)
_ORIGINAL = "_accel_original"


def remove_forward_wrapper(module: nn.Module) -> None:
    """Undo the forward wrapper that ``Precision.wrap_forward`` installed on ``module`` (if any)."""
    patched = module.__dict__.get("forward")
    original = getattr(patched, _ORIGINAL, None)
    if original is None:
        return
    if getattr(original, "__func__", None) is type(module).forward:
        del module.__dict__["forward"]  # back to the class's own forward
    else:
        module.forward = original


class Precision(ABC):
    """Base of the precision modes: full-precision backward and step unless a mode overrides."""

    mode: PrecisionType = PrecisionType.NO

    def __init__(self, device: torch.device, autocast: AutocastKwargs | None = None) -> None:
        self.device = device
        self.autocast_kwargs = autocast or AutocastKwargs()

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return None

    # -- forward ---------------------------------------------------------------------------------
    @abstractmethod
    def forward_context(self, autocast: AutocastKwargs | None = None
                        ) -> contextlib.AbstractContextManager[Any]:
        """The context a forward pass runs in (``accelerator.autocast()``)."""

    @abstractmethod
    def wrap_forward(self, model: nn.Module) -> nn.Module:
        """Make ``model``'s forward run in ``forward_context``; returns ``model``."""

    def unwrap_forward(self, model: nn.Module) -> nn.Module:
        """Remove what ``wrap_forward`` installed (``unwrap_model(keep_fp32_wrapper=False)``)."""
        remove_forward_wrapper(model)
        return model

    def check_model(self, model: nn.Module) -> None:
        """Refuse parameters this mode cannot train, naming them and the fix."""

    # -- backward and step -------------------------------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.scale_loss(loss).backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale gradients of ``optimizer`` once per real step (no-op without a scaler)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step ``optimizer``; False when the step was skipped (fp16 inf/nan gradients)."""
        optimizer.step(**kwargs)
        return True

    # -- checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
