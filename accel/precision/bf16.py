"""bfloat16 autocast (CPU, CUDA with bf16 support, XLA); no loss scaling needed."""

from __future__ import annotations

import torch

from ..config.settings import PrecisionType
from .autocast import AutocastPrecision

__all__ = ["BF16Precision"]


class BF16Precision(AutocastPrecision):
    mode = PrecisionType.BF16
    dtype = torch.bfloat16
