"""Consolidated safetensors (Hugging Face names) from sharded state, one tensor at a time.

:func:`save_model_streamed` writes a live sharded module (``Accelerator.save_model`` of an FSDP
model): every rank gathers one tensor at a time (``DTensor.full_tensor()``) and rank 0 writes
each file as soon as its tensors are in, so no rank ever holds the whole model.
:func:`merge_weights` does the same from a checkpoint's DCP shards, in one process without a
process group (``accel merge-weights``): DCP assembles each output file's tensors from the
shards (every shard file verified against the manifest first).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ...run.progress import tqdm
from ..storage import CheckpointError, ModelFilesWriter, plan_shards, read_manifest
from .dcp_io import ShardReader
from .layout import has_shards, model_prefix
from .states import dcp_load

__all__ = ["merge_weights", "save_model_streamed", "sharded_models"]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on CPU (a DTensor is gathered: a collective on its mesh)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    whole = full_tensor() if callable(full_tensor) else tensor
    return whole.detach().cpu()


def save_model_streamed(module: nn.Module, *, directory: str | Path,
                        max_shard_size: int | str = "10GB", write: bool,
                        metadata: Mapping[str, str] | None = None) -> Path | None:
    """Call on every rank; the rank with ``write`` (rank 0) writes ``model.safetensors`` or
    ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``.

    The files are planned from the tensors' global sizes, then filled in order: every rank
    gathers the next tensor, the writer keeps it until its file is complete and writes it.
    Tied weights (one parameter under several names) are gathered and stored once.

    Returns:
        The written file to pass around (the weights file or the index) on the writer, else
        None.
    """
    state = module.state_dict(keep_vars=True)  # tied parameters: the same object twice
    first: dict[int, str] = {}
    sizes: dict[str, int] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
            continue
        first[id(tensor)] = name
        sizes[name] = tensor.numel() * tensor.element_size()
    writer = ModelFilesWriter(directory, sizes, max_shard_size, aliases, metadata) \
        if write else None
    for index, names in enumerate(plan_shards(sizes, max_shard_size)):
        tensors = {name: _full(state[name]) for name in names}
        if writer is not None:
            writer.write(index, tensors)
        del tensors
    return writer.finish() if writer is not None else None


def sharded_models(checkpoint: str | Path) -> list[int]:
    """The indices of the models a complete checkpoint holds as DCP shards.

    Raises:
        CheckpointError: not a complete accel checkpoint, or no model in it is sharded.
    """
    manifest = read_manifest(checkpoint)
    models, index = [], 0
    while has_shards(manifest, model_prefix(index)) or \
            f"model_{index}.safetensors" in manifest.files:
        if has_shards(manifest, model_prefix(index)):
            models.append(index)
        index += 1
    if not models:
        raise CheckpointError(
            f"{checkpoint} holds no sharded model state (no {model_prefix(0)}/ files): it was "
            "saved by a run without FSDP or with FULL_STATE_DICT, and its model_<i>.safetensors "
            "files are consolidated already", path=checkpoint)
    return models


def merge_weights(checkpoint: str | Path, *, output: str | Path,
                  max_shard_size: int | str = "10GB", progress: bool = True) -> list[Path]:
    """Consolidate every sharded model of ``checkpoint`` into safetensors with HF names.

    One model goes to ``output``; several to ``output/model_<i>``. Runs in one process, no
    process group. Every shard file is verified against the manifest (once) before its bytes
    are used; one output file's tensors are in memory at a time.

    Returns:
        What each model's consolidation wrote (the weights file or the index).

    Raises:
        CheckpointError: ``checkpoint`` is not a complete accel checkpoint, holds no sharded
            model, or a shard file is damaged.
    """
    checkpoint = Path(checkpoint)
    indices = sharded_models(checkpoint)
    manifest = read_manifest(checkpoint)
    headers = manifest.meta.get("sharded", {}).get("headers", {})
    readers = [ShardReader(checkpoint, model_prefix(i), manifest, headers, verify_once=True)
               for i in indices]
    for reader in readers:  # nothing is written from a damaged checkpoint
        reader.verify_all()
    written = []
    for index, reader in zip(indices, readers, strict=True):
        tensors = reader.read_metadata().state_dict_metadata
        shapes = {fqn: meta for fqn, meta in tensors.items()
                  if isinstance(meta, TensorStorageMetadata)}
        sizes = {fqn: meta.size.numel() * meta.properties.dtype.itemsize
                 for fqn, meta in shapes.items()}
        target = Path(output) if len(indices) == 1 else Path(output) / f"model_{index}"
        writer = ModelFilesWriter(target, sizes, max_shard_size)
        bar = tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, disable=not progress,
                   desc=f"model_{index}", is_main=True)
        for file_index, names in enumerate(writer.shards):
            part = {fqn: torch.empty(shapes[fqn].size, dtype=shapes[fqn].properties.dtype)
                    for fqn in names}
            dcp_load(part, reader=reader, distributed=False)
            writer.write(file_index, part)
            bar.update(sum(sizes[fqn] for fqn in names))
        bar.close()
        written.append(writer.finish())
    return written
