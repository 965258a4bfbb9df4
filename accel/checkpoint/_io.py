"""Low-level file I/O for checkpoints: hash while writing or reading, fsync, atomic rename.

Everything goes through unbuffered raw files in large chunks so that data is copied once
between the kernel and the tensor memory, and the sha256 is computed on cache-hot chunks.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["CHUNK", "FileRecord", "HashingWriter", "fsync_dir", "fsync_file", "hash_file",
           "new_token", "read_hashed"]

CHUNK = 4 << 20  # small enough to stay in cache between hashing and copying


@dataclass(frozen=True)
class FileRecord:
    """Size in bytes and sha256 hex digest of one file, as listed in a manifest."""

    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, value: Any) -> FileRecord:
        if (not isinstance(value, dict) or not isinstance(value.get("size"), int)
                or isinstance(value.get("size"), bool) or not isinstance(value.get("sha256"), str)):
            raise ValueError(f"expected {{'size': int, 'sha256': str}}, found {value!r}")
        return cls(size=value["size"], sha256=value["sha256"])


def new_token() -> str:
    """A random token for temporary names (rank 0 picks it and broadcasts it)."""
    return secrets.token_hex(6)


def fsync_dir(path: str | Path) -> None:
    """Persist a directory's entries (new names, renames) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingWriter:
    """Write a new file (never overwrites), hashing every byte; ``close()`` fsyncs it.

    Used as a context manager, a failure inside the block removes the partial file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "xb", buffering=0)  # noqa: SIM115 - closed in close()/__exit__
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK):
            chunk = view[start:start + CHUNK]
            self._sha.update(chunk)
            while chunk:  # raw writes may be partial
                written = self._fh.write(chunk)
                chunk = chunk[written or 0:]
        self.size += len(view)

    def close(self) -> FileRecord:
        """Flush to disk and return the file's record."""
        os.fsync(self._fh.fileno())
        self._fh.close()
        return FileRecord(self.size, self._sha.hexdigest())

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self._fh.close()
            self.path.unlink(missing_ok=True)
        elif not self._fh.closed:
            self.close()


def read_hashed(path: str | Path) -> tuple[bytearray, str]:
    """Read a whole file into a fresh buffer and return it with its sha256 hex digest.

    Raises:
        OSError: the file cannot be opened or read (callers turn this into a CheckpointError).
    """
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        buf = bytearray(size)
        view = memoryview(buf)
        pos = 0
        while pos < size:
            got = fh.readinto(view[pos:pos + CHUNK])
            if not got:
                raise OSError(f"{path} shrank while being read ({pos} of {size} bytes)")
            sha.update(view[pos:pos + got])
            pos += got
    return buf, sha.hexdigest()


def hash_file(path: str | Path) -> FileRecord:
    """Size and sha256 of a file on disk, read in chunks (constant memory)."""
    sha = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while got := fh.readinto(view):
            sha.update(view[:got])
            size += got
    return FileRecord(size, sha.hexdigest())
