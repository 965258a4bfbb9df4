"""Read a listed safetensors file straight into its tensors' own memory, verified before use.

The header is read and parsed first (to know where each tensor's bytes lie); then every piece
of the file (see :class:`._io.FileRecord`) is read by a pool of threads (one per file) straight into
freshly allocated per-tensor storage, and hashed right after, while it is in the CPU cache. No
tensor is handed out before the digest of every byte, the parsed header included, matched the
manifest's. Per-tensor storage (like ``torch.load``'s) means no whole-file buffer: no extra
copy for misaligned tensors, the allocator's recycled memory is reused, and one tensor kept
alive (an optimizer state) does not keep the whole file's memory alive.

Files this path does not cover (whole-file digests of format 1, tensors that do not tile the
data region exactly) return ``None``: the caller reads them whole with :func:`._io.read_hashed`
and parses them with :func:`._st.parse`, which also gives the precise error for a damaged file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from . import _st
from ._io import FileRecord, _combine, _results, piece_pool
from .errors import CheckpointError

__all__ = ["read_tensors"]

#: one run of a file read into (or, for the header, already in) memory: (offset, view, read)
_Run = tuple[int, memoryview, bool]


def _plan(fd: int, size: int, source: str) -> tuple[bytearray, dict[str, Any], list[Any]] | None:
    """The header bytes, metadata and (name, dtype, shape, begin, end) entries in file order,
    or None when the tensors do not tile the data region exactly (the caller's generic path)."""
    prefix = os.pread(fd, 8, 0)
    try:
        end = _st.header_size(prefix, source)
    except CheckpointError:
        return None
    if end > size:
        return None
    head = bytearray(end)
    if os.preadv(fd, [head], 0) != end:
        return None
    try:
        header, metadata = _st.parse_header(head, source)
        entries = [(name, *_st.entry_of(entry, name=name, data_size=size - end, source=source))
                   for name, entry in header.items()]
    except CheckpointError:  # the generic path gives the precise error
        return None
    pos = 0
    for *_name_dtype_shape, begin, stop in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != pos:  # a gap or an overlap: not a file this path reads
            return None
        pos = stop
    return (head, metadata, entries) if end + pos == size else None


def _pieces(runs: list[_Run], piece_size: int) -> list[list[_Run]]:
    """``runs`` (back to back from offset 0) cut at every multiple of ``piece_size``."""
    pieces: list[list[_Run]] = [[]]
    filled = 0
    for offset, view, read in runs:
        while len(view):
            take = min(len(view), piece_size - filled)
            pieces[-1].append((offset, view[:take], read))
            offset, view, filled = offset + take, view[take:], filled + take
            if filled == piece_size:
                pieces.append([])
                filled = 0
    return [p for p in pieces if p]


def _read_and_hash(fd: int, piece: list[_Run], source: str) -> bytes:
    sha = hashlib.sha256()
    for offset, view, read in piece:
        pos = 0
        while read and pos < len(view):
            got = os.preadv(fd, [view[pos:]], offset + pos)
            if not got:
                raise OSError(f"{source} shrank while being read")
            pos += got
        sha.update(view)
    return sha.digest()


def read_tensors(path: Path, record: FileRecord) -> tuple[dict[str, torch.Tensor],
                                                          dict[str, str]] | None:
    """Verified tensors (each in its own memory) and metadata of the safetensors file ``path``
    that ``record`` lists, or None for files the generic path reads (see the module doc).

    Raises:
        OSError: the file cannot be opened or read.
        CheckpointError: the file's bytes do not match ``record`` (nothing is returned).
    """
    if not record.piece_size:
        return None
    source = str(path)
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        size = os.fstat(fd).st_size
        planned = _plan(fd, size, source) if size == record.size else None
        if planned is None:
            return None
        head, metadata, entries = planned
        tensors: dict[str, torch.Tensor] = {}
        runs: list[_Run] = [(0, memoryview(head), False)]
        for name, dtype, shape, begin, _end in sorted(entries, key=lambda e: e[3]):
            tensors[name] = torch.empty(shape, dtype=dtype)
            if tensors[name].numel():
                raw = tensors[name].reshape(-1).view(torch.uint8).numpy()
                runs.append((len(head) + begin, memoryview(raw), True))  # type: ignore[arg-type]
        pieces = _pieces(runs, record.piece_size)
        if len(pieces) == 1:
            digest = _combine([_read_and_hash(fd, pieces[0], source)])
        else:
            with piece_pool(len(pieces)) as pool:
                digest = _combine(_results(
                    [pool.submit(_read_and_hash, fd, piece, source) for piece in pieces]))
    if digest != record.sha256:
        raise CheckpointError(
            f"{path} is corrupt: its {size} bytes have digest {digest[:16]}…, the manifest "
            f"lists {record.sha256[:16]}…; the file was changed or damaged after the save, "
            "load another checkpoint", path=path)
    ordered = {name: tensors[name] for name, *_rest in entries}  # the header's order
    return _st.with_aliases(ordered, metadata, source), metadata
