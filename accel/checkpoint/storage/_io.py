"""Low-level file I/O for checkpoints: hash while writing or reading, fsync, atomic rename.

Everything goes through unbuffered raw files in large chunks so that data is copied once
between the kernel and the tensor memory, and the sha256 is computed on cache-hot chunks.

Files are hashed in pieces (:data:`PIECE` bytes each, the last one shorter): a record's digest
is the sha256 of the concatenated sha256 digests of its pieces, recorded with ``piece_size``.
When a file is read, its pieces are read *and* hashed by a pool of threads at once
(positional reads; hashlib and file I/O release the GIL), so loading one large file uses every
core; when it is written, a helper thread hashes it while the caller writes.
Records without ``piece_size`` (checkpoints written by earlier accel versions, manifest format
1) hold the sha256 of the whole file and are still verified, in one sequential pass.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import mmap
import os
import queue
import secrets
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["CHUNK", "PIECE", "Buffer", "FileRecord", "HashingWriter", "alloc_buffer",
           "digest_bytes", "fsync_dir", "fsync_file", "hash_file", "hash_open", "new_token",
           "read_hashed"]

CHUNK = 4 << 20  # raw read/write size
PIECE = 4 << 20  # bytes per independently hashed piece (a record's ``piece_size``)
Buffer = bytearray | mmap.mmap
_THREAD_MIN = 1 << 20  # below this, hash inline: a thread costs more than it saves
_MAX_WORKERS = 8
_RING_PIECE_MAX = 16 << 20  # larger pieces are hashed in one thread, in constant memory


@dataclass(frozen=True, kw_only=True, slots=True)
class FileRecord:
    """Size in bytes and sha256 hex digest of one file, as listed in a manifest.

    ``piece_size`` > 0: ``sha256`` is the sha256 of the concatenated sha256 digests of the
    file's consecutive ``piece_size``-byte pieces (see :func:`digest_bytes`); 0: the sha256 of
    the whole file (format 1 manifests).
    """

    size: int
    sha256: str
    piece_size: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": self.size, "sha256": self.sha256}
        if self.piece_size:
            out["piece_size"] = self.piece_size
        return out

    @classmethod
    def from_json(cls, value: Any) -> FileRecord:
        piece = value.get("piece_size", 0) if isinstance(value, dict) else None
        if (not isinstance(value, dict) or not isinstance(value.get("size"), int)
                or isinstance(value.get("size"), bool) or not isinstance(value.get("sha256"), str)
                or not isinstance(piece, int) or isinstance(piece, bool) or piece < 0):
            raise ValueError(f"expected {{'size': int, 'sha256': str[, 'piece_size': int]}}, "
                             f"found {value!r}")
        return cls(size=value["size"], sha256=value["sha256"], piece_size=piece)


def digest_bytes(data: bytes | bytearray | memoryview, piece_size: int = PIECE) -> str:
    """The digest a :class:`FileRecord` with ``piece_size`` lists for a file holding ``data``.

    Example:
        >>> import hashlib
        >>> digest_bytes(b"abc", 0) == hashlib.sha256(b"abc").hexdigest()
        True
        >>> digest_bytes(b"abc", 2) == hashlib.sha256(hashlib.sha256(b"ab").digest()
        ...                                           + hashlib.sha256(b"c").digest()).hexdigest()
        True
    """
    view = memoryview(data).cast("B")
    if not piece_size:
        return hashlib.sha256(view).hexdigest()
    return _combine([hashlib.sha256(view[i:i + piece_size]).digest()
                     for i in range(0, len(view), piece_size)])


def _combine(digests: Sequence[bytes]) -> str:
    return hashlib.sha256(b"".join(digests)).hexdigest()


def _workers() -> int:
    return max(2, min(_MAX_WORKERS, os.cpu_count() or 2))


@contextlib.contextmanager
def piece_pool(jobs: int) -> Iterator[ThreadPoolExecutor]:
    """Threads for the ``jobs`` piece reads or hashes of one file, joined on exit: no thread
    outlives the call or is shared between callers (no module-level pool, DESIGN.md §3.2; the
    few thread starts cost well under a millisecond against the milliseconds a file of more
    than one 4 MiB piece takes)."""
    with ThreadPoolExecutor(max(1, min(_workers(), jobs)),
                            thread_name_prefix="accel-ckpt-io") as pool:
        yield pool


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
    """The digest (see :class:`FileRecord`) of a sequence of buffers; once one is large, all
    are hashed on a helper thread.

    hashlib releases the GIL on large buffers, so hashing runs in parallel with the file I/O of
    the calling thread. Buffers must stay unchanged until :meth:`hexdigest` returns.
    """

    def __init__(self, piece_size: int = 0) -> None:
        self._piece = piece_size
        self._sha = hashlib.sha256()
        self._filled = 0  # bytes of the current piece hashed so far
        self._digests: list[bytes] = []
        self._queue: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def update(self, view: memoryview) -> None:
        if self._thread is None:
            if len(view) < _THREAD_MIN:
                self._consume(view)
                return
            self._thread = threading.Thread(target=self._run, name="accel-sha256", daemon=True)
            self._thread.start()
        self._queue.put(view)

    def _consume(self, view: memoryview) -> None:
        if not self._piece:
            self._sha.update(view)
            return
        while len(view):
            take = min(len(view), self._piece - self._filled)
            self._sha.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self._piece:
                self._digests.append(self._sha.digest())
                self._sha, self._filled = hashlib.sha256(), 0

    def _run(self) -> None:
        while (view := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._consume(view)
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
        if not self._piece:
            return self._sha.hexdigest()
        return _combine(self._digests + ([self._sha.digest()] if self._filled else []))


class _NoHasher(_Hasher):
    def update(self, view: memoryview) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def _read_piece(fd: int, *, view: memoryview, offset: int, hashing: bool, path: str) -> bytes:
    """Fill ``view`` with the file's bytes from ``offset`` on; the sha256 digest of them."""
    pos = 0
    while pos < len(view):
        got = os.preadv(fd, [view[pos:]], offset + pos)
        if not got:
            raise OSError(f"{path} shrank while being read ({offset + pos} bytes found)")
        pos += got
    return hashlib.sha256(view).digest() if hashing else b""


def _results(jobs: Sequence[Future[bytes] | bytes]) -> list[bytes]:
    """Every job's digest, in order; waits for all of them before raising the first failure
    (no thread may still use a buffer once the caller moves on)."""
    futures = [job for job in jobs if isinstance(job, Future)]
    wait_futures(futures)
    return [job.result() if isinstance(job, Future) else job for job in jobs]


class HashingWriter:
    """Write a new file (never overwrites), hashing every byte unless ``hashing=False``.

    The digest is of pieces of ``piece_size`` bytes (default :data:`PIECE`, see
    :class:`FileRecord`), computed on a helper thread while the calling thread writes (one
    hashing thread per file: files are written in parallel by :class:`.format.CheckpointWriter`;
    more threads per file measured more CPU time and no faster on a busy machine).
    ``close()`` fsyncs the file and returns its record.

    Used as a context manager, a failure inside the block removes the partial file.
    """

    def __init__(self, path: str | Path, *, hashing: bool = True, piece_size: int | None = None
                 ) -> None:
        piece_size = PIECE if piece_size is None else piece_size
        if piece_size <= 0:
            raise ValueError(f"piece_size must be a positive number of bytes, got {piece_size}")
        self.path = Path(path)
        self._fh = open(self.path, "xb", buffering=0)  # noqa: SIM115 - closed in close()/__exit__
        self._piece = piece_size if hashing else 0
        self._hasher = _Hasher(piece_size) if hashing else _NoHasher()
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
        return FileRecord(size=self.size, sha256=digest, piece_size=self._piece)

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


def read_hashed(path: str | Path, *, hashing: bool = True, piece_size: int | None = None
                ) -> tuple[Buffer, str]:
    """Read a whole file into a fresh buffer and return it with its digest (see
    :class:`FileRecord`: ``piece_size`` 0 is the sha256 of the whole file).

    The file is copied into memory (not mapped): a file changed or truncated later cannot change
    or crash what was loaded. Pieces are read and hashed by a pool of threads (one per call) at once
    (each piece hashed right after it was read, while it is in the CPU cache); ``piece_size`` 0
    reads sequentially and hashes on one helper thread.

    Raises:
        OSError: the file cannot be opened or read (callers turn this into a CheckpointError).
    """
    piece_size = PIECE if piece_size is None else piece_size
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        buf = alloc_buffer(size)
        if hashing and not piece_size:
            return buf, _read_whole(fh, buf, str(path))
        view = memoryview(buf)
        step = piece_size or CHUNK
        jobs = [functools.partial(_read_piece, fh.fileno(), view=view[i:i + step], offset=i,
                                  hashing=hashing, path=str(path))
                for i in range(0, size, step)]
        if len(jobs) <= 1:
            digests = [job() for job in jobs]
        else:
            with piece_pool(len(jobs)) as pool:
                digests = _results([pool.submit(job) for job in jobs])
    return buf, _combine(digests) if hashing else ""


def _read_whole(fh: io.RawIOBase, buf: Buffer, path: str) -> str:
    """Sequential read of the whole file into ``buf``; the sha256 of the whole file."""
    hasher = _Hasher()
    view = memoryview(buf)
    try:
        pos = 0
        while pos < len(buf):
            got = fh.readinto(view[pos:pos + CHUNK])
            if not got:
                raise OSError(f"{path} shrank while being read ({pos} of {len(buf)} bytes)")
            hasher.update(view[pos:pos + got])
            pos += got
    finally:
        hasher.stop()
    return hasher.hexdigest()


def hash_file(path: str | Path, piece_size: int | None = None) -> FileRecord:
    """Size and digest of a file on disk (see :class:`FileRecord`), in constant memory."""
    with open(path, "rb", buffering=0) as fh:
        return hash_open(fh, piece_size)


def hash_open(fh: io.RawIOBase, piece_size: int | None = None) -> FileRecord:
    """Size and digest of an open file from its current position on (see :class:`FileRecord`).

    Read in pieces into a few reused buffers (constant memory, no page faults on fresh memory);
    the pool hashes the pieces while the next ones are read. ``piece_size`` 0: the sha256 of
    the whole bytes, in one pass.
    """
    piece_size = PIECE if piece_size is None else piece_size
    if not piece_size or piece_size > _RING_PIECE_MAX:
        return _hash_sequential(fh, piece_size)
    ring = [bytearray(piece_size) for _ in range(min(_workers() + 1, 4))]
    pending: deque[Future[bytes]] = deque()
    digests: list[bytes] = []
    size = 0
    with piece_pool(len(ring)) as pool:
        try:
            for index in range(1 << 62):
                if len(pending) == len(ring):  # the oldest piece's buffer is reused next
                    digests.append(pending.popleft().result())
                view = memoryview(ring[index % len(ring)])
                got = _fill(fh, view)
                if got:
                    pending.append(pool.submit(_digest, view[:got]))
                    size += got
                if got < piece_size:
                    break
        finally:
            wait_futures(pending)
    digests.extend(job.result() for job in pending)
    return FileRecord(size=size, sha256=_combine(digests), piece_size=piece_size)


def _hash_sequential(fh: io.RawIOBase, piece_size: int) -> FileRecord:
    """:func:`hash_open` in one thread, for whole-file records and very large pieces."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    sha, digests, size, in_piece = hashlib.sha256(), [], 0, 0
    while got := fh.readinto(view[:min(CHUNK, piece_size - in_piece) if piece_size else CHUNK]):
        sha.update(view[:got])
        size += got
        in_piece += got
        if piece_size and in_piece == piece_size:
            digests.append(sha.digest())
            sha, in_piece = hashlib.sha256(), 0
    if not piece_size:
        return FileRecord(size=size, sha256=sha.hexdigest())
    if in_piece:
        digests.append(sha.digest())
    return FileRecord(size=size, sha256=_combine(digests), piece_size=piece_size)


def _fill(fh: io.RawIOBase, view: memoryview) -> int:
    pos = 0
    while pos < len(view) and (got := fh.readinto(view[pos:])):
        pos += got
    return pos


def _digest(view: memoryview) -> bytes:
    return hashlib.sha256(view).digest()
