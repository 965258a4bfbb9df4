"""Pickle-free DCP storage inside an accel checkpoint: safetensors shards, hashed and verified.

:class:`ShardWriter` is torch's ``HuggingFaceStorageWriter(save_distributed=True)`` (one file
per rank, ``shard-0000<r+1>-model-00001-of-00001.safetensors``, shard offsets in each header's
``DCP_SHARDING_INFO``, no ``.metadata`` pickle) whose files are written by accel's storage: every
byte hashed while it is written, fsynced, and recorded (size, sha256, and the sha256 of the
header alone) for the checkpoint's manifest. :class:`ShardReader` is torch's
``HuggingFaceStorageReader`` over the files a manifest lists: the metadata DCP plans from is
parsed from headers whose hash matches the recorded one; while the ranks plan, the data files
are hashed in chunks against the manifest, each by one rank (a damaged file fails the load
everywhere before any rank copies a tensor), and each needed byte is then read once, straight
into the target tensor, from a file whose (size, mtime, ctime, inode) is still the one verified.
Sharding, planning and resharding stay torch's (:func:`torch.distributed.checkpoint.save`/
``load``).

The files are plain safetensors with torch's DCP sharding metadata (torch's own
``HuggingFaceStorageReader`` reads them); tied weights are stored once, their other names
listed in the ``accel.aliases`` metadata, which this reader restores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
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
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ..storage import CheckpointError, FileRecord, Manifest, _st
from ..storage._io import HashingWriter, hash_open
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


_Stamp = tuple[int, int, int, int]  # (size, mtime_ns, ctime_ns, inode) of a verified file


def _stamp(fd: int) -> _Stamp:
    """What changes when a file is written to or replaced (ctime cannot be set back)."""
    stat = os.fstat(fd)
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


def _verify_file(root: Path, rel: str, manifest: Manifest) -> _Stamp:
    """Hash a listed file (constant memory) against the manifest; its stamp, which each later
    read of the file checks (a file changed after this check is refused, not used)."""
    path = root / rel
    try:
        with open(path, "rb", buffering=0) as fh:
            before = _stamp(fh.fileno())
            found = hash_open(fh, manifest.files[rel].piece_size)
            after = _stamp(fh.fileno())
    except OSError as exc:
        raise CheckpointError(f"{path} is missing or unreadable: {exc}", path=path) from exc
    if found != manifest.files[rel]:
        raise CheckpointError(f"{path} is corrupt: its size or sha256 differs from the "
                              "manifest's; the file was changed or damaged after the save",
                              path=path)
    if before != after:
        raise _changed(path)
    return after


def _changed(path: Path) -> CheckpointError:
    return CheckpointError(f"{path} changed after it was verified (its size, change "
                           "times or inode differ); something is writing to the checkpoint: "
                           "stop it and load again", path=path)


def _read_header(root: Path, rel: str, expected: str | None
                 ) -> tuple[dict[str, Any], Any, int]:
    """A shard's header entries, DCP offsets and data start, after checking the header's
    recorded hash."""
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
    return entries, info, len(raw)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Entry:
    """Where one stored tensor's bytes lie in its (verified) file."""

    start: int  # byte offset of its first element in the file
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, entry: Any, data_start: int, what: str) -> _Entry:
        try:
            dtype = _st.DTYPE_NAMES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{what}: malformed header entry {entry!r} ({exc!r}); the "
                                  "checkpoint was not written by accel") from None
        if min(shape, default=0) < 0 or begin < 0 or \
                end - begin != math.prod(shape) * dtype.itemsize:
            raise CheckpointError(f"{what}: the header entry {entry!r} is inconsistent (dtype, "
                                  "shape and offsets disagree); the checkpoint is damaged")
        return cls(start=data_start + begin, dtype=dtype, shape=shape)


def _read_exactly(fh: io.RawIOBase, *, offset: int, tensor: torch.Tensor, path: Path) -> None:
    """Fill contiguous CPU ``tensor`` with the file's bytes from ``offset`` on."""
    view = memoryview(tensor.view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    fh.seek(offset)
    pos = 0
    while pos < len(view):
        got = fh.readinto(view[pos:])
        if not got:
            raise _changed(path)  # verified files are long enough: it was truncated since
        pos += got


def _read_item(fh: io.RawIOBase, *, entry: _Entry, item: ReadItem, target: torch.Tensor,
               path: Path) -> None:
    """Copy the part of a stored tensor that ``item`` names into ``target``: read straight
    into the target's memory when the part is one run of bytes and the target a contiguous
    CPU tensor of the stored dtype (loads at the saved world size, and FSDP's row shards at any
    other), else through a temporary (another dtype or device, column-wise resharding)."""
    offsets, lengths = list(item.storage_offsets), list(item.lengths)
    if len(offsets) != len(entry.shape) or target.size() != torch.Size(lengths) or any(
            o < 0 or o + n > d for o, n, d in zip(offsets, lengths, entry.shape, strict=True)):
        raise CheckpointError(f"{path}: {item.storage_index.fqn} is stored as a "
                              f"{entry.shape} chunk; the part {offsets} + {lengths} of it "
                              f"cannot fill a {tuple(target.size())} tensor", path=path)
    if target.numel() == 0:
        return
    strides = [math.prod(entry.shape[d + 1:]) for d in range(len(entry.shape))]
    size = entry.dtype.itemsize
    partial = [d for d, (n, full) in enumerate(zip(lengths, entry.shape, strict=True)) if n != full]
    if not partial or all(lengths[d] == 1 for d in range(partial[-1])):  # one run of bytes
        first = entry.start + sum(o * s for o, s in zip(offsets, strides, strict=True)) * size
        if target.is_cpu and target.dtype == entry.dtype and target.is_contiguous() \
                and not target.is_conj() and not target.is_neg():
            _read_exactly(fh, offset=first, tensor=target, path=path)
            return
        region = torch.empty(lengths, dtype=entry.dtype)
        _read_exactly(fh, offset=first, tensor=region, path=path)
    else:  # whole rows, then the wanted columns of them
        region = torch.empty([lengths[0], *entry.shape[1:]], dtype=entry.dtype)
        _read_exactly(fh, offset=entry.start + offsets[0] * strides[0] * size, tensor=region,
                      path=path)
        for dim in range(1, len(lengths)):
            region = region.narrow(dim, offsets[dim], lengths[dim])
    target.copy_(region)


class ShardReader(HuggingFaceStorageReader):
    """Read one DCP state (``prefix``) of a checkpoint, verifying every file before use.

    ``headers`` maps each shard file to the sha256 of its header (the manifest's
    ``meta["sharded"]["headers"]``). The metadata is built once and cached.
    """

    def __init__(self, root: Path, prefix: str, manifest: Manifest,
                 headers: Mapping[str, str], *, verify_once: bool = False) -> None:
        super().__init__(str(root / prefix))
        self.verify_once = verify_once
        #: (this rank, world size) of the load's process group, set by ``states.dcp_load``:
        #: ranks then share the hashing (the default (0, 1) hashes every needed file here)
        self.ranks = (0, 1)
        self._checked: dict[str, _Stamp] = {}  # verified file -> its stamp then
        self.root, self.prefix, self.manifest = root, prefix, manifest
        self.header_hashes = dict(headers)
        self.files = shard_files(manifest, prefix)
        self._metadata: Metadata | None = None
        self._layouts: dict[str, dict[str, _Entry]] = {}  # file -> fqn -> where its bytes are

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
            entries, info, start = _read_header(self.root, rel, self.header_hashes.get(rel))
            layout = self._layouts[rel] = {}
            for fqn, entry in entries.items():
                layout[fqn] = _Entry.of(entry, start, f"{self.root / rel}: {fqn}")
                shape, dtype = torch.Size(layout[fqn].shape), layout[fqn].dtype
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
        """Verify files now: DCP exchanges the plans (and any rank's failure) before any rank
        copies data, so a damaged file stops the load on every rank before a single tensor is
        changed. Files are hashed in chunks, several at once on threads (hashlib releases the
        GIL); with ``ranks`` set, rank r hashes every file i with i % world == r, whoever
        needs it (so no file is hashed twice), and the stamps of the verified files travel
        with the plans (:meth:`prepare_global_plan`). :meth:`read_data` then reads each needed
        byte once, straight into the target tensors, refusing a file whose stamp changed."""
        needed = sorted({self.storage_data[item.storage_index] for item in plan.items})
        rank, world = self.ranks
        if self.verify_once:  # many loads from one reader (merge-weights): hash each file once
            self._verify([rel for rel in needed if rel not in self._checked])
            return plan
        self._checked = {}  # each load hashes again (the files may have changed since)
        self._verify(needed if world == 1 else self.files[rank::world])
        return dataclasses.replace(plan, storage_data=dict(self._checked))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Hand every rank the stamps of all the files that any rank verified."""
        stamps: dict[str, _Stamp] = {}
        for plan in plans:
            if isinstance(plan.storage_data, dict):
                stamps.update(plan.storage_data)
        return [dataclasses.replace(plan, storage_data=stamps) for plan in plans]

    def _verify(self, files: list[str]) -> None:
        if len(files) > 1:
            workers = min(len(files), os.cpu_count() or 1)
            with ThreadPoolExecutor(workers, thread_name_prefix="accel-verify") as pool:
                stamps = list(pool.map(lambda rel: _verify_file(self.root, rel, self.manifest),
                                       files))
        else:
            stamps = [_verify_file(self.root, rel, self.manifest) for rel in files]
        self._checked.update(zip(files, stamps, strict=True))

    def verify_all(self) -> None:
        """Hash every file of this state against the manifest now (once each), so that a
        damaged checkpoint is refused before anything is written from it."""
        self._verify([rel for rel in self.files if rel not in self._checked])

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if not self._layouts:
            self.read_metadata()
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index], []).append(item)
        if isinstance(plan.storage_data, dict):
            self._checked.update(plan.storage_data)
        self._verify([rel for rel in per_file if rel not in self._checked])  # never unverified
        for rel, items in per_file.items():
            path = self.root / rel
            try:
                with open(path, "rb", buffering=0) as fh:
                    if _stamp(fh.fileno()) != self._checked[rel]:
                        raise _changed(path)
                    for item in items:
                        target = planner.resolve_tensor(item).detach()
                        _read_item(fh, entry=self._layouts[rel][item.storage_index.fqn], item=item,
                                   target=target, path=path)
                        planner.commit_tensor(item, target)
                    if _stamp(fh.fileno()) != self._checked[rel]:
                        raise _changed(path)
            except OSError as exc:
                raise CheckpointError(f"{path} is unreadable: {exc}", path=path) from exc
        future: Future[None] = Future()
        future.set_result(None)
        return future
