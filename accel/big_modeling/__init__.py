"""Big-model loading and inference (Accelerate's ``accelerate.big_modeling`` names).

Example:
    >>> from accel.big_modeling import init_empty_weights
    >>> import torch
    >>> with init_empty_weights():
    ...     layer = torch.nn.Linear(4, 4)
    >>> layer.weight.device.type
    'meta'
"""

from __future__ import annotations

from .empty import init_empty_weights, init_on_device

__all__ = ["init_empty_weights", "init_on_device"]
