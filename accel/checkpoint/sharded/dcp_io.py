"""Pickle-free DCP storage inside an accel checkpoint: safetensors shards, hashed and verified.

:class:`ShardWriter` is torch's ``HuggingFaceStorageWriter(save_distributed=True)`` (one file
per rank, ``shard-0000<r+1>-model-00001-of-00001.safetensors``, shard offsets in each header's
``DCP_SHARDING_INFO``, no ``.metadata`` pickle) whose files are written by accel's storage: every
byte hashed while it is written, fsynced, and recorded (size, sha256, and the sha256 of the
header alone) for the checkpoint's manifest. :class:`ShardReader` is torch's
``HuggingFaceStorageReader`` over the files a manifest lists: the metadata DCP plans from is
parsed from headers whose hash matches the recorded one, and each data file a rank needs is
read once into memory, its sha256 compared with the manifest, while the ranks plan (before any
rank copies a tensor; a damaged file fails the load everywhere with nothing changed). Sharding,
planning and resharding stay torch's (:func:`torch.distributed.checkpoint.save`/``load``).

The files are plain safetensors with torch's DCP sharding metadata (torch's own
``HuggingFaceStorageReader`` reads them); tied weights are stored once, their other names
listed in the ``accel.aliases`` metadata, which this reader restores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.hf_storage import (
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
)
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ..storage import CheckpointError, FileRecord, Manifest, _st, load_tensors
from ..storage._io import HashingWriter, hash_file
from .layout import shard_files

__all__ = ["ShardReader", "ShardWriter", "dcp_errors"]

_INFO_KEY = "DCP_SHARDING_INFO"  # torch's names (torch.distributed.checkpoint._hf_utils)
_VERSION_KEY = "DCP_VERSION"
_OFFSETS_KEY = "saved_offsets"


@contextlib.contextmanager
def dcp_errors(what: str) -> Iterator[None]:
    """Turn DCP's ``CheckpointException`` (a ``BaseException`` that carries every failed
    rank's error) into the first failure: a :class:`CheckpointError` as it was raised (it names
    the file), anything else as a :class:`CheckpointError` naming the rank."""
    try:
        yield
    except CheckpointException as exc:
        rank, (first, _trace) = min(exc.failures.items(), key=lambda item: item[0])
        if isinstance(first, CheckpointError):
            raise first from None
        raise CheckpointError(f"{what} failed on rank {rank}: {type(first).__name__}: "
                              f"{first}") from None


def _file_name(shard_index: int) -> str:
    return f"shard-{shard_index:05d}-model-00001-of-00001.safetensors"


class ShardWriter(HuggingFaceStorageWriter):
    """Write this rank's part of one DCP state into ``root/prefix`` with accel's storage.

    After ``dcp.save``, :attr:`records` holds this rank's files (relative to ``root``) and
    :attr:`headers` the sha256 of each file's header, for the manifest.
    """

    def __init__(self, root: Path, prefix: str) -> None:
        super().__init__(str(root / prefix), save_distributed=True, thread_count=1)
        self.root, self.prefix = root, prefix
        self.records: dict[str, FileRecord] = {}
        self.headers: dict[str, str] = {}

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results: list[WriteResult] = []
        if plan.items:
            name = _file_name(int(plan.storage_data["shard_index"]))
            tensors: dict[str, torch.Tensor] = {}
            offsets: dict[str, Any] = {}
            for item in plan.items:
                if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
                    raise TypeError(f"{self.prefix}: {item.index.fqn!r} is not a tensor; the "
                                    "sharded state holds tensors only (other values go to JSON)")
                tensor = planner.resolve_data(item)
                if not isinstance(tensor, torch.Tensor):
                    raise TypeError(f"{self.prefix}: {item.index.fqn!r} resolved to a "
                                    f"{type(tensor).__name__}, expected a tensor")
                tensors[item.index.fqn] = tensor
                offsets[item.index.fqn] = {_OFFSETS_KEY: list(item.tensor_data.chunk.offsets)}
                length = tensor.numel() * tensor.element_size()
                results.append(WriteResult(index=item.index, size_in_bytes=length,
                                           storage_data=_StorageInfo(name, 0, length)))
            meta = {_INFO_KEY: json.dumps(offsets), _VERSION_KEY: "1.0"}
            rel = f"{self.prefix}/{name}"
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with HashingWriter(path) as out:
                header = _st.write(out, tensors, meta)
                self.records[rel] = out.close()
            self.headers[rel] = hashlib.sha256(header).hexdigest()
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future


def _verify_file(root: Path, rel: str, manifest: Manifest) -> tuple[int, int]:
    """Hash a listed file (constant memory) against the manifest; its (size, mtime_ns)."""
    path = root / rel
    try:
        found = hash_file(path)
        stat = path.stat()
    except OSError as exc:
        raise CheckpointError(f"{path} is missing or unreadable: {exc}", path=path) from exc
    if found != manifest.files[rel]:
        raise CheckpointError(f"{path} is corrupt: its size or sha256 differs from the "
                              "manifest's; the file was changed or damaged after the save",
                              path=path)
    return stat.st_size, stat.st_mtime_ns


def _read_header(root: Path, rel: str, expected: str | None) -> tuple[dict[str, Any], Any]:
    """A shard's header entries and DCP offsets, after checking the header's recorded hash."""
    path = root / rel
    if expected is None:
        raise CheckpointError(f"{path}: the manifest records no header hash for this shard "
                              "file; the checkpoint is damaged or was not written by accel",
                              path=path)
    try:
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            raw = prefix + fh.read(_st.header_size(prefix, str(path)) - 8)
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}", path=path) from exc
    if hashlib.sha256(raw).hexdigest() != expected:
        raise CheckpointError(f"{path} is corrupt: its header does not match the hash the "
                              "manifest records; load another checkpoint", path=path)
    entries, metadata = _st.parse_header(raw, str(path))
    try:
        info = json.loads(metadata[_INFO_KEY])
        aliases = json.loads(metadata.get(_st.ALIASES_KEY, "{}"))
        entries.update({alias: entries[stored] for alias, stored in aliases.items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path} lacks valid {_INFO_KEY} or {_st.ALIASES_KEY} metadata "
                              f"({exc!r})", path=path) from None
    return entries, info


class ShardReader(HuggingFaceStorageReader):
    """Read one DCP state (``prefix``) of a checkpoint, verifying every file before use.

    ``headers`` maps each shard file to the sha256 of its header (the manifest's
    ``meta["sharded"]["headers"]``). The metadata is built once and cached.
    """

    def __init__(self, root: Path, prefix: str, manifest: Manifest,
                 headers: Mapping[str, str], *, verify_once: bool = False) -> None:
        super().__init__(str(root / prefix))
        self.verify_once = verify_once
        self._checked: dict[str, tuple[int, int]] = {}  # verified file -> (size, mtime_ns)
        self.root, self.prefix, self.manifest = root, prefix, manifest
        self.header_hashes = dict(headers)
        self.files = shard_files(manifest, prefix)
        self._metadata: Metadata | None = None
        self._verified: dict[str, dict[str, torch.Tensor]] = {}

    def read_metadata(self) -> Metadata:  # no rank-local metadata (no **kwargs): one file set
        if self._metadata is None:
            self._metadata = self._build_metadata()
        metadata = self._metadata
        metadata.storage_meta = StorageMeta(load_id=self.load_id)
        return metadata

    def _build_metadata(self) -> Metadata:
        if not self.files:
            raise CheckpointError(f"{self.root} holds no sharded state under {self.prefix}/",
                                  path=self.root)
        tensors: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        storage: dict[MetadataIndex, Any] = {}
        for rel in self.files:
            entries, info = _read_header(self.root, rel, self.header_hashes.get(rel))
            for fqn, entry in entries.items():
                shape = torch.Size(int(d) for d in entry["shape"])
                dtype = _st.DTYPE_NAMES[entry["dtype"]]
                offset = torch.Size(int(o) for o in info[fqn][_OFFSETS_KEY])
                chunk = ChunkStorageMetadata(offsets=offset, sizes=shape)
                size = torch.Size(o + s for o, s in zip(offset, shape, strict=True))
                known = tensors.get(fqn)
                if not isinstance(known, TensorStorageMetadata):
                    tensors[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), size,
                                                         [chunk])
                else:
                    known.chunks.append(chunk)
                    known.size = torch.Size(max(a, b) for a, b in zip(known.size, size,
                                                                       strict=True))
                storage[MetadataIndex(fqn=fqn, offset=offset)] = rel
        return Metadata(state_dict_metadata=tensors, storage_data=storage)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Read and verify every file this rank will read, now: DCP exchanges the plans
        (and any rank's failure) before any rank copies data, so a damaged file stops the
        load on every rank before a single tensor is changed."""
        needed = sorted({self.storage_data[item.storage_index] for item in plan.items})
        if self.verify_once:  # many loads from one reader (merge-weights): hash each file once
            for rel in needed:
                if rel not in self._checked:
                    self._checked[rel] = _verify_file(self.root, rel, self.manifest)
            return plan
        self._verified = {rel: load_tensors(self.root, rel, self.manifest) for rel in needed}
        return plan

    def verify_all(self) -> None:
        """Hash every file of this state against the manifest now (once each), so that a
        damaged checkpoint is refused before anything is written from it."""
        for rel in self.files:
            if rel not in self._checked:
                self._checked[rel] = _verify_file(self.root, rel, self.manifest)

    def _stored(self, rel: str) -> dict[str, torch.Tensor]:
        stored = self._verified.pop(rel, None)
        if stored is not None:
            return stored
        if rel not in self._checked:  # verified before use all the same
            return load_tensors(self.root, rel, self.manifest)
        path = self.root / rel
        with open(path, "rb") as fh:
            stat = os.fstat(fh.fileno())
            if (stat.st_size, stat.st_mtime_ns) != self._checked[rel]:
                raise CheckpointError(f"{path} changed after it was verified; was it modified "
                                      "during the merge?", path=path)
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        return _st.parse(mapped, str(path))[0]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index], []).append(item)
        for rel, items in per_file.items():
            stored = self._stored(rel)
            for item in items:
                source = stored[item.storage_index.fqn]
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths,
                                                          strict=True)):
                    source = source.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                if target.size() != source.size():
                    raise CheckpointError(f"{self.root / rel}: {item.storage_index.fqn} has "
                                          f"a {tuple(source.size())} chunk where "
                                          f"{tuple(target.size())} is needed", path=self.root)
                target.copy_(source)
                planner.commit_tensor(item, target)
            del stored
        self._verified.clear()
        future: Future[None] = Future()
        future.set_result(None)
        return future
