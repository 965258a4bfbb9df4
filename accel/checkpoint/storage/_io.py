"""Low-level file I/O for checkpoints: hash while writing or reading, fsync, atomic rename.

Everything goes through unbuffered raw files in large chunks so that data is copied once
between the kernel and the tensor memory, and the sha256 is computed on cache-hot chunks.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import queue
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["CHUNK", "Buffer", "FileRecord", "HashingWriter", "alloc_buffer", "fsync_dir",
           "fsync_file", "hash_file", "hash_open", "new_token", "read_hashed"]

CHUNK = 4 << 20  # raw read/write size
Buffer = bytearray | mmap.mmap
_THREAD_MIN = 1 << 20  # below this, hash inline: a thread costs more than it saves


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


class _Hasher:
    """sha256 of a sequence of buffers; large ones are hashed on a helper thread.

    hashlib releases the GIL on large buffers, so hashing runs in parallel with the file I/O of
    the calling thread. Buffers must stay unchanged until :meth:`hexdigest` returns.
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._queue: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def update(self, view: memoryview) -> None:
        if self._thread is None:
            if len(view) < _THREAD_MIN:
                self._sha.update(view)
                return
            self._thread = threading.Thread(target=self._run, name="accel-sha256", daemon=True)
            self._thread.start()
        self._queue.put(view)

    def _run(self) -> None:
        while (view := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._sha.update(view)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller in hexdigest
                    self._error = exc

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def hexdigest(self) -> str:
        self.stop()
        if self._error is not None:
            raise RuntimeError(f"hashing failed: {self._error!r}") from self._error
        return self._sha.hexdigest()


class _NoHasher(_Hasher):
    def update(self, view: memoryview) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


class HashingWriter:
    """Write a new file (never overwrites), hashing every byte unless ``hashing=False``.

    ``close()`` fsyncs the file and returns its record.

    Used as a context manager, a failure inside the block removes the partial file.
    """

    def __init__(self, path: str | Path, *, hashing: bool = True) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "xb", buffering=0)  # noqa: SIM115 - closed in close()/__exit__
        self._hasher = _Hasher() if hashing else _NoHasher()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data`` (kept alive and unchanged by the caller until :meth:`close`)."""
        view = memoryview(data).cast("B")
        self._hasher.update(view)
        for start in range(0, len(view), CHUNK):
            chunk = view[start:start + CHUNK]
            while chunk:  # raw writes may be partial
                written = self._fh.write(chunk)
                chunk = chunk[written or 0:]
        self.size += len(view)

    def close(self) -> FileRecord:
        """Flush to disk and return the file's record."""
        os.fsync(self._fh.fileno())  # first: the disk flush overlaps with the hash thread
        digest = self._hasher.hexdigest()
        self._fh.close()
        return FileRecord(self.size, digest)

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self._hasher.stop()
            self._fh.close()
            self.path.unlink(missing_ok=True)
        elif not self._fh.closed:
            self.close()


def alloc_buffer(size: int) -> Buffer:
    """A writable buffer for a whole file; large ones are private anonymous memory.

    Filling a fresh anonymous mapping measured cheaper than filling a bytearray, and it is
    returned to the OS as soon as the last tensor viewing it is freed. (Huge pages were
    measured too: faster on an idle machine, much slower under memory pressure.)
    """
    if size < _THREAD_MIN or not hasattr(mmap, "MAP_PRIVATE"):
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


def read_hashed(path: str | Path, *, hashing: bool = True) -> tuple[Buffer, str]:
    """Read a whole file into a fresh buffer and return it with its sha256 hex digest.

    The file is copied into memory (not mapped): a file changed or truncated later cannot change
    or crash what was loaded. Hashing runs on a helper thread while the next chunk is read.

    Raises:
        OSError: the file cannot be opened or read (callers turn this into a CheckpointError).
    """
    hasher = _Hasher() if hashing else _NoHasher()
    try:
        with open(path, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            buf = alloc_buffer(size)
            view = memoryview(buf)
            pos = 0
            while pos < size:
                got = fh.readinto(view[pos:pos + CHUNK])
                if not got:
                    raise OSError(f"{path} shrank while being read ({pos} of {size} bytes)")
                hasher.update(view[pos:pos + got])
                pos += got
    finally:
        hasher.stop()
    return buf, hasher.hexdigest()


def hash_file(path: str | Path) -> FileRecord:
    """Size and sha256 of a file on disk, read in chunks (constant memory)."""
    with open(path, "rb", buffering=0) as fh:
        return hash_open(fh)


def hash_open(fh: io.RawIOBase) -> FileRecord:
    """Size and sha256 of an open file from its current position on, read in chunks into one
    reused buffer (constant memory, no page faults on fresh memory)."""
    sha = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    while got := fh.readinto(view):
        sha.update(view[:got])
        size += got
    return FileRecord(size, sha.hexdigest())
