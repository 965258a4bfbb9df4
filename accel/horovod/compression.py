"""Gradient compression for the wire: ``hvd.Compression.none`` and ``hvd.Compression.fp16``.

A compressor turns a tensor into what is sent (``compress`` returns it and a context) and back
(``decompress``), as Horovod's do, so custom compressors written for Horovod plug in unchanged.

Example:
    >>> import torch
    >>> from accel.horovod import Compression
    >>> sent, ctx = Compression.fp16.compress(torch.tensor([1.5, 2.0]))
    >>> sent.dtype, Compression.fp16.decompress(sent, ctx).dtype
    (torch.float16, torch.float32)
    >>> Compression.none.compress(torch.tensor([1]))[0].dtype
    torch.int64
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """Floating-point tensors travel as ``wire``; other dtypes are sent as they are."""

    wire: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16 (half the bytes) and come back in their dtype."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """As :class:`FP16Compressor` with bfloat16 (float32's range; some vendor builds offer it)."""

    wire = torch.bfloat16


class Compression:
    """The compressors by name: ``Compression.none``, ``Compression.fp16`` (and ``bf16``)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
