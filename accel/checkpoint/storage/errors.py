"""The one error type of the checkpoint layer.

Example:
    >>> from accel.checkpoint.storage.errors import CheckpointError
    >>> str(CheckpointError("ckpt/model.safetensors is missing", path="ckpt/model.safetensors"))
    'ckpt/model.safetensors is missing'
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint (or one of its files) is missing, incomplete, corrupt or unreadable.

    Attributes:
        path: the file or directory at fault, when one is known.
    """

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None
