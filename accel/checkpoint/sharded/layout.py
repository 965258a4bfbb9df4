"""Where DCP state lives inside a checkpoint, and what a rank reports after writing some.

Kept free of ``torch.distributed`` imports: importing the checkpoint protocol (and so
``accel.Accelerator``) must not import DCP and FSDP, which only runs that use them need.

Example:
    >>> model_prefix(0), optimizer_prefix(1)
    ('sharded/model_0', 'sharded/optimizer_1')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..storage import FileRecord, Manifest

__all__ = ["SHARDED_DIR", "ShardedFiles", "has_shards", "model_prefix", "optimizer_prefix",
           "shard_files"]

#: Where DCP state lives inside a checkpoint: ``sharded/model_0/``, ``sharded/optimizer_0/``.
SHARDED_DIR = "sharded"


def model_prefix(index: int) -> str:
    return f"{SHARDED_DIR}/model_{index}"


def optimizer_prefix(index: int) -> str:
    return f"{SHARDED_DIR}/optimizer_{index}"


def shard_files(manifest: Manifest, prefix: str) -> list[str]:
    """The safetensors files a manifest lists under ``prefix/`` (one DCP state), sorted."""
    return sorted(rel for rel in manifest.files
                  if rel.startswith(f"{prefix}/") and rel.endswith(".safetensors"))


def has_shards(manifest: Manifest, prefix: str) -> bool:
    """Whether the checkpoint holds DCP state under ``prefix`` (e.g. ``sharded/model_0``)."""
    return bool(shard_files(manifest, prefix))


class _Written(Protocol):
    records: dict[str, FileRecord]
    headers: dict[str, str]


@dataclass(kw_only=True, slots=True)
class ShardedFiles:
    """The DCP files this rank wrote (for the manifest) and their header hashes."""

    records: dict[str, FileRecord] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def take(self, writer: _Written) -> None:
        self.records.update(writer.records)
        self.headers.update(writer.headers)
