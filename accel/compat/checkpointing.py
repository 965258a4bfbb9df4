"""Accelerate's ``accelerate.checkpointing`` names."""

from __future__ import annotations

from ..accelerator.checkpoints import CheckpointingMixin

__all__ = ["CheckpointingMixin"]
