"""Write a checkpoint directory atomically: temporary sibling, fsynced files, manifest last, rename.

A checkpoint is a directory whose ``manifest.json`` lists every file with its size and sha256
digest (format 2: of the file's 4 MiB pieces, see :class:`._io.FileRecord`; format 1, the sha256
of the whole file, is still read).
It is built under ``.tmp-<name>-<token>`` in the same parent (so the final rename is atomic),
every file is fsynced, the manifest is written last, and only then is the directory renamed to
its final name. A directory without a valid manifest is never a checkpoint.

Several ranks can write into the same temporary directory: rank 0 picks a token
(:func:`new_token`) and broadcasts it, every rank writes its own files with
:class:`CheckpointWriter` (or :func:`write_tensors`/:func:`write_json`/:func:`write_state`),
the caller runs a barrier and gathers the ranks' records, and rank 0 calls :func:`finalize`.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> writer = CheckpointWriter(root / "checkpoint_0")
    >>> _ = writer.write_tensors("model.safetensors", {"w": torch.ones(2)})
    >>> _ = writer.write_state("optimizer", {"state": {0: {"step": 1}}, "param_groups": []})
    >>> writer.finalize(step=1, world_size=1).name
    'checkpoint_0'
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

import torch

from ..._base.version import __version__ as _ACCEL_VERSION
from . import _st
from ._io import FileRecord, HashingWriter, fsync_dir, fsync_file, hash_file, new_token
from .codec import encode
from .errors import CheckpointError

__all__ = ["FORMAT_VERSION", "MANIFEST", "STATE_FORMAT", "CheckpointWriter", "FileRecord",
           "check_relpath", "finalize", "new_token", "remove_checkpoint", "temp_dir_for",
           "write_json", "write_state", "write_tensors"]

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # 2: files hashed in pieces (FileRecord.piece_size); 1 still loads
STATE_FORMAT = "accel.state"
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"


def check_relpath(relpath: str) -> str:
    """Validate a file name inside a checkpoint (relative, posix, no ``..``, not hidden)."""
    parts = PurePosixPath(relpath).parts if isinstance(relpath, str) else ()
    if (not parts or relpath.startswith("/") or "\\" in relpath
            or str(PurePosixPath(relpath)) != relpath
            or any(p in (".", "..") or p.startswith(".") for p in parts) or relpath == MANIFEST):
        raise ValueError(f"invalid checkpoint file name {relpath!r}: expected a relative posix "
                         f"path like 'rng/rank_0.safetensors' without '..', hidden parts or "
                         f"the reserved name {MANIFEST!r}")
    return relpath


def temp_dir_for(target: str | Path, token: str) -> Path:
    """The temporary sibling directory in which ``target`` is built (same parent: atomic rename)."""
    target = Path(target)
    if not token or not token.isalnum():
        raise ValueError(f"token must be a non-empty alphanumeric string, got {token!r}")
    return target.parent / f"{TEMP_PREFIX}{target.name}-{token}"


def _new_file(tmpdir: Path, relpath: str) -> HashingWriter:
    path = Path(tmpdir) / check_relpath(relpath)
    path.parent.mkdir(parents=True, exist_ok=True)
    return HashingWriter(path)


def write_tensors(tmpdir: str | Path, *, relpath: str, tensors: Mapping[str, torch.Tensor],
                  metadata: Mapping[str, str] | None = None) -> FileRecord:
    """Write a safetensors file into ``tmpdir`` (fsynced) and return its size and sha256.

    Tied weights (identical views) are stored once and restored on load.
    """
    with _new_file(Path(tmpdir), relpath) as out:
        _st.write(out, tensors, metadata)
        return out.close()


def _json_bytes(value: Any) -> bytes:
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot write JSON: {exc}; pass plain JSON values, or use write_state "
                        "for tensors, tuples, int keys, inf/nan") from exc


def _write_bytes(tmpdir: Path, relpath: str, data: bytes) -> FileRecord:
    with _new_file(Path(tmpdir), relpath) as out:
        out.write(data)
        return out.close()


def write_json(tmpdir: str | Path, relpath: str, value: Any) -> FileRecord:
    """Write strict JSON (no NaN/inf; encode those with :mod:`.codec`)."""
    return _write_bytes(Path(tmpdir), relpath, _json_bytes(value))


def _state_doc(stem: str, state: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors, structure = encode(state)
    doc = {"format": STATE_FORMAT, "version": FORMAT_VERSION,
           "tensors": f"{stem}.safetensors" if tensors else None, "state": structure}
    return tensors, doc


def write_state(tmpdir: str | Path, stem: str, state: Any) -> dict[str, FileRecord]:
    """Write any nested state (optimizer, scheduler, RNG, …) as ``<stem>.json`` (+ tensors).

    Tensors and numpy arrays go to ``<stem>.safetensors`` (only written when there are any);
    the structure goes to ``<stem>.json``, which names the tensor file. Read it back with
    :func:`accel.checkpoint.storage.reader.read_state`.

    Raises:
        TypeError: ``state`` holds a value that cannot be stored without pickle (names its path).
    """
    tensors, doc = _state_doc(stem, state)
    records: dict[str, FileRecord] = {}
    if tensors:
        records[doc["tensors"]] = write_tensors(tmpdir, relpath=doc["tensors"], tensors=tensors)
    records[f"{stem}.json"] = write_json(tmpdir, f"{stem}.json", doc)
    return records


def _scan(tmpdir: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root, _dirs, files in os.walk(tmpdir):
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(tmpdir).as_posix()
            if rel != MANIFEST:
                found[rel] = path
    return dict(sorted(found.items()))


def _file_records(tmpdir: Path, records: Mapping[str, FileRecord]) -> dict[str, FileRecord]:
    found = _scan(tmpdir)
    missing = sorted(set(records) - set(found))
    if missing:
        raise CheckpointError(f"files reported as written are missing from {tmpdir}: {missing}; "
                              "did every rank write into the same directory (same token)?",
                              path=tmpdir)
    out: dict[str, FileRecord] = {}
    for rel, path in found.items():
        check_relpath(rel)
        record = records.get(rel)
        if record is None:  # written by someone who did not report it: hash it now
            fsync_file(path)
            record = hash_file(path)
        elif path.stat().st_size != record.size:
            raise CheckpointError(f"{path} has {path.stat().st_size} bytes but its writer "
                                  f"reported {record.size}; was it modified during the save?",
                                  path=path)
        out[rel] = record
    for root, _dirs, _files in os.walk(tmpdir):
        fsync_dir(root)
    return out


def _manifest_doc(files: Mapping[str, FileRecord], *, step: int, world_size: int,
                  meta: Mapping[str, Any] | None, accel_version: str) -> dict[str, Any]:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if not isinstance(accel_version, str) or not accel_version:
        raise ValueError(f"accel_version must be a non-empty string such as '1.0.0', got "
                         f"{accel_version!r}")
    doc = {"format": "accel-checkpoint", "format_version": FORMAT_VERSION, "step": step,
           "world_size": world_size, "accel_version": accel_version,
           "torch_version": torch.__version__,
           "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "files": {rel: rec.to_json() for rel, rec in files.items()}, "meta": dict(meta or {})}
    try:
        json.dumps(doc["meta"], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"checkpoint meta must be plain JSON (str keys, finite numbers, strings, "
                        f"lists, dicts): {exc}") from exc
    return doc


def _swap_into_place(tmpdir: Path, target: Path, token: str) -> None:
    old: Path | None = None
    if target.exists():  # move the old one aside first: the name never points at a partial dir
        old = target.parent / f"{OLD_PREFIX}{target.name}-{token}"
        os.rename(target, old)
    os.rename(tmpdir, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old)


def finalize(tmpdir: str | Path, *, target: str | Path, step: int, world_size: int,
             meta: Mapping[str, Any] | None = None,
             records: Mapping[str, FileRecord] | None = None,
             accel_version: str = _ACCEL_VERSION) -> Path:
    """Hash, write ``manifest.json`` last, fsync and rename ``tmpdir`` to ``target`` (rank 0 only).

    Args:
        tmpdir: the temporary directory every rank wrote into (:func:`temp_dir_for`).
        target: the final checkpoint directory; an existing one is replaced (moved aside first).
        step: training step stored in the manifest.
        world_size: number of ranks that wrote the checkpoint.
        meta: free-form JSON stored under ``meta`` in the manifest.
        records: sizes and hashes the writers computed (gathered from all ranks); files not
            listed are hashed here.
        accel_version: the writer's version recorded in the manifest (the caller passes it, so
            this layer never imports the package root; defaults to accel's own).

    Returns:
        ``target`` as a Path.
    """
    tmpdir, target = Path(tmpdir), Path(target)
    if tmpdir.parent.resolve() != target.parent.resolve():
        raise ValueError(f"{tmpdir} and {target} must share a parent for an atomic rename")
    files = _file_records(tmpdir, records or {})
    doc = _manifest_doc(files, step=step, world_size=world_size, meta=meta,
                        accel_version=accel_version)
    (tmpdir / MANIFEST).unlink(missing_ok=True)
    with HashingWriter(tmpdir / MANIFEST) as out:
        out.write(json.dumps(doc, indent=1, allow_nan=False).encode("utf-8"))
        out.close()
    fsync_dir(tmpdir)
    _swap_into_place(tmpdir, target, tmpdir.name.rsplit("-", 1)[-1])
    return target


def remove_checkpoint(path: str | Path) -> None:
    """Delete a checkpoint so that no crash can leave a half-deleted directory that looks whole.

    The directory is first renamed to a hidden ``.old-`` name (atomic), then removed.
    """
    path = Path(path)
    hidden = path.parent / f"{OLD_PREFIX}{path.name}-{new_token()}"
    os.rename(path, hidden)
    fsync_dir(path.parent)
    shutil.rmtree(hidden)


class CheckpointWriter:
    """Write one rank's files for a checkpoint into its temporary directory, in parallel.

    Every rank creates one with the same ``target`` and ``token``; rank 0 calls
    :meth:`finalize` after a barrier, passing the records gathered from the other ranks
    (:meth:`wait` returns this rank's). States are encoded (and bad values rejected) at the
    call; the files are written by ``workers`` threads, so tensors passed in must not be
    modified until :meth:`wait`/:meth:`finalize` returns.

    Example:
        >>> import tempfile
        >>> w = CheckpointWriter(Path(tempfile.mkdtemp()) / "ckpt", token="abc123")
        >>> w.tmpdir.name
        '.tmp-ckpt-abc123'
        >>> w.abort()
    """

    def __init__(self, target: str | Path, token: str | None = None, *, workers: int = 2) -> None:
        self.target = Path(target)
        self.token = token or new_token()
        self.tmpdir = temp_dir_for(self.target, self.token)
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="accel-ckpt")
        self._pending: dict[str, Future[FileRecord]] = {}

    def _submit(self, relpath: str, fn: Callable[..., FileRecord], **kwargs: Any) -> None:
        check_relpath(relpath)
        if relpath in self._pending:
            raise ValueError(f"{relpath!r} was already written to this checkpoint; use one "
                             "name per component (e.g. optimizer_1 for a second optimizer)")
        self._pending[relpath] = self._pool.submit(fn, self.tmpdir, relpath=relpath, **kwargs)

    def write_tensors(self, relpath: str, tensors: Mapping[str, torch.Tensor],
                      metadata: Mapping[str, str] | None = None) -> None:
        """Queue a safetensors file (names and tensors are validated now)."""
        _st.plan(tensors)
        self._submit(relpath, write_tensors, tensors=dict(tensors), metadata=metadata)

    def write_json(self, relpath: str, value: Any) -> None:
        """Queue a strict-JSON file (serialised now)."""
        self._submit(relpath, _write_bytes, data=_json_bytes(value))

    def write_state(self, stem: str, state: Any) -> None:
        """Queue ``<stem>.json`` (+ ``<stem>.safetensors``); see :func:`write_state`."""
        tensors, doc = _state_doc(stem, state)
        data = _json_bytes(doc)  # everything that can fail, before anything is queued
        if tensors:
            _st.plan(tensors)  # a tensor safetensors cannot hold fails here, not in a thread
            self._submit(doc["tensors"], write_tensors, tensors=tensors, metadata=None)
        self._submit(f"{stem}.json", _write_bytes, data=data)

    def wait(self) -> dict[str, FileRecord]:
        """Wait for every queued file; return their records (raises the first failure)."""
        futures_wait(self._pending.values())
        return {rel: future.result() for rel, future in self._pending.items()}

    def finalize(self, *, step: int, world_size: int, meta: Mapping[str, Any] | None = None,
                 records: Mapping[str, FileRecord] | None = None,
                 accel_version: str = _ACCEL_VERSION) -> Path:
        """Rank 0: write the manifest and rename into place (``records``: other ranks' files)."""
        try:
            mine = self.wait()
        finally:
            self.close()
        return finalize(self.tmpdir, target=self.target, step=step, world_size=world_size,
                        meta=meta,
                        records={**(records or {}), **mine}, accel_version=accel_version)

    def close(self) -> None:
        """Wait for the writing threads to finish and release them (ranks other than 0)."""
        self._pool.shutdown(wait=True)

    def abort(self) -> None:
        """Stop writing and remove the temporary directory (after a failed save)."""
        for future in self._pending.values():
            future.cancel()
        self.close()
        if self.tmpdir.exists():
            shutil.rmtree(self.tmpdir)

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()
