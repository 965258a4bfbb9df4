"""Read a wandb offline run's ``.wandb`` file with wandb's own protobuf schema (tests only)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

__all__ = ["wandb_config", "wandb_history", "wandb_records"]


def wandb_records(run_file: Path) -> list[Any]:
    """The records of a ``.wandb`` file, decoded with wandb's own protobuf schema.

    The file is wandb's LevelDB-style log (header ``:W&B``, 32 KiB blocks, each record chunk
    prefixed by crc32/length/type); wandb 0.2x+ no longer ships a Python reader for it.
    """
    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending, records = run_file.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the tail of a block too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _items(updates: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in updates}


def wandb_config(records: list[Any]) -> dict[str, Any]:
    """The run's config: the run record's, then each config update in order."""
    config: dict[str, Any] = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = record.run.config if kind == "run" else record.config
            config.update(_items(updates.update))
    return config


def wandb_history(records: list[Any]) -> list[tuple[int, dict[str, Any]]]:
    """(step, row) for each history row written, in order (nested keys joined with "/", e.g.
    "img/_type")."""
    return [(record.history.step.num, _items(record.history.item)) for record in records
            if record.WhichOneof("record_type") == "history"]
