"""Read a checkpoint directory: manifest, completeness, verification and verified components.

Every component is read once into memory while its digest is computed, compared with the
manifest, and only then handed out. Safetensors files are read straight into each tensor's own
memory (their header is parsed first, to know where the bytes go: :mod:`._fill`), JSON files
into one buffer that is parsed after the check; both read and hash the file's pieces on a pool
of threads. Checkpoints whose manifest lists whole-file sha256s (format 1) load too. Nothing
here unpickles.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from accel.checkpoint.storage.format import CheckpointWriter
    >>> w = CheckpointWriter(Path(tempfile.mkdtemp()) / "ckpt")
    >>> _ = w.write_state("scheduler", {"last_epoch": 3, "base_lrs": [0.1]})
    >>> ckpt = w.finalize(step=3, world_size=1)
    >>> is_complete(ckpt), read_state(ckpt, "scheduler")["last_epoch"]
    (True, 3)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import _fill, _st
from ._io import Buffer, FileRecord, hash_file, read_hashed
from .codec import decode
from .errors import CheckpointError
from .format import FORMAT_VERSION, MANIFEST, STATE_FORMAT, check_relpath

__all__ = ["CheckpointReader", "Manifest", "is_complete", "load_component", "load_json",
           "load_tensors", "read_manifest", "read_state", "verify"]

_MAX_MANIFEST = 64 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """The parsed ``manifest.json`` of a checkpoint directory."""

    path: Path
    format_version: int
    step: int
    world_size: int
    accel_version: str
    torch_version: str
    created: str
    files: dict[str, FileRecord] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def _bad_manifest(directory: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{directory / MANIFEST} is not a valid accel manifest: {why}. The directory is not a "
        "usable checkpoint; load another one (latest_complete(root) finds the newest complete)",
        path=directory / MANIFEST)


def _parse_manifest(directory: Path, raw: bytes) -> Manifest:
    if _st.describe_foreign(raw):
        raise _bad_manifest(directory, "it is a pickle/zip file, not JSON (never unpickled)")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad_manifest(directory, f"it is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != "accel-checkpoint":
        raise _bad_manifest(directory, "it lacks \"format\": \"accel-checkpoint\"")
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise _bad_manifest(directory, f"format_version {version!r} is newer than this accel reads "
                            f"({FORMAT_VERSION}); upgrade accel")
    try:
        files = {check_relpath(rel): FileRecord.from_json(rec) for rel, rec in doc["files"].items()}
        return Manifest(path=directory, format_version=version, step=int(doc["step"]),
                        world_size=int(doc["world_size"]), accel_version=str(doc["accel_version"]),
                        torch_version=str(doc["torch_version"]), created=str(doc["created"]),
                        files=files, meta=dict(doc.get("meta") or {}))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _bad_manifest(directory, f"a field is missing or malformed ({exc})") from None


def read_manifest(directory: str | Path) -> Manifest:
    """Parse and validate ``directory/manifest.json``.

    Raises:
        CheckpointError: the manifest is missing (an interrupted save) or invalid.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_MANIFEST + 1)
    except FileNotFoundError:
        kind = "directory" if directory.is_dir() else "path (it does not exist)"
        raise CheckpointError(
            f"{path} not found: the {kind} {directory} is not a complete accel checkpoint (an "
            "interrupted save leaves no manifest); pass a complete checkpoint directory, e.g. "
            "latest_complete(root)", path=path) from None
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}", path=path) from exc
    if len(raw) > _MAX_MANIFEST:
        raise _bad_manifest(directory, f"it is larger than {_MAX_MANIFEST} bytes")
    return _parse_manifest(directory, raw)


def is_complete(directory: str | Path) -> bool:
    """True when ``directory`` has a valid manifest and every listed file has the listed size.

    Cheap (no hashing); :func:`verify` checks contents.
    """
    directory = Path(directory)
    try:
        manifest = read_manifest(directory)
        return all((directory / rel).stat().st_size == rec.size
                   for rel, rec in manifest.files.items())
    except (CheckpointError, OSError):
        return False


def verify(directory: str | Path) -> Manifest:
    """Check every file's size and sha256 against the manifest.

    Raises:
        CheckpointError: listing every missing, unreadable or corrupt file.
    """
    manifest = read_manifest(directory)
    problems = []
    for rel, rec in manifest.files.items():
        try:
            found = hash_file(manifest.path / rel, rec.piece_size)
        except FileNotFoundError:
            problems.append(f"{rel}: missing")
            continue
        except OSError as exc:
            problems.append(f"{rel}: unreadable ({exc})")
            continue
        if found != rec:
            problems.append(f"{rel}: corrupt (size {found.size}, sha256 {found.sha256[:12]}…; "
                            f"manifest says size {rec.size}, sha256 {rec.sha256[:12]}…)")
    if problems:
        raise CheckpointError(f"checkpoint {manifest.path} failed verification: "
                              + "; ".join(problems), path=manifest.path)
    return manifest


def _record(directory: Path, relpath: str, manifest: Manifest) -> FileRecord:
    record = manifest.files.get(relpath)
    if record is None:
        path = directory / relpath
        raise CheckpointError(
            f"{path} is not part of checkpoint {directory} (not listed in its {MANIFEST}; it lists "
            f"{sorted(manifest.files)}); was it saved with a different set of objects?", path=path)
    return record


_Tensors = tuple[dict[str, torch.Tensor], dict[str, str]]


def _tensors_verified(directory: Path, relpath: str, manifest: Manifest) -> _Tensors:
    """A listed safetensors file's verified tensors, read straight into their own memory
    (:mod:`._fill`), or read whole, verified and parsed where that path does not apply."""
    record = _record(directory, relpath, manifest)
    path = directory / relpath
    try:
        done = _fill.read_tensors(path, record)
    except FileNotFoundError:
        done = None  # the generic path names the missing file
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}", path=path) from exc
    if done is not None:
        return done
    return _st.parse(_read_verified(directory, relpath, manifest), str(path))


def _read_verified(directory: Path, relpath: str, manifest: Manifest | None) -> Buffer:
    manifest = manifest or read_manifest(directory)
    path = directory / relpath
    record = _record(directory, relpath, manifest)
    try:
        buf, sha = read_hashed(path, piece_size=record.piece_size)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing from checkpoint {directory} (listed in its "
                              f"{MANIFEST}); the checkpoint is damaged, load another one",
                              path=path) from None
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}", path=path) from exc
    if len(buf) != record.size or sha != record.sha256:
        raise CheckpointError(
            f"{path} is corrupt: it has {len(buf)} bytes with sha256 {sha[:16]}…, the manifest "
            f"lists {record.size} bytes with sha256 {record.sha256[:16]}…; the file was changed "
            "or damaged after the save, load another checkpoint", path=path)
    return buf


class CheckpointReader:
    """Verified reads from one checkpoint; files named in ``prefetch`` are read in parallel.

    Each file is read once into memory while its digest is computed and checked against the
    manifest before anything read from it is returned. ``prefetch`` lists relpaths or state
    stems (``"optimizer"`` means ``optimizer.json`` and ``optimizer.safetensors``) to start
    reading on ``workers`` threads now; names the manifest lacks are skipped here and raise
    when accessed.

    Example:
        >>> import tempfile, torch
        >>> from accel.checkpoint.storage.format import CheckpointWriter
        >>> w = CheckpointWriter(Path(tempfile.mkdtemp()) / "ckpt")
        >>> w.write_tensors("model.safetensors", {"w": torch.ones(2)})
        >>> ckpt = w.finalize(step=0, world_size=1)
        >>> CheckpointReader(ckpt, prefetch=["model.safetensors"]).tensors("model.safetensors")
        {'w': tensor([1., 1.])}
    """

    def __init__(self, directory: str | Path, prefetch: Iterable[str] = (), *,
                 manifest: Manifest | None = None, workers: int = 2) -> None:
        self.directory = Path(directory)
        self.manifest = manifest or read_manifest(self.directory)
        self._futures: dict[str, Future[Buffer]] = {}
        self._tensor_futures: dict[str, Future[_Tensors]] = {}
        files = list(dict.fromkeys(rel for name in prefetch for rel in self._expand(name)))
        if files:
            pool = ThreadPoolExecutor(min(max(1, workers), len(files)),
                                      thread_name_prefix="accel-ckpt-read")
            for rel in files:
                if rel.endswith(".safetensors"):
                    self._tensor_futures[rel] = pool.submit(_tensors_verified, self.directory,
                                                            rel, self.manifest)
                else:
                    self._futures[rel] = pool.submit(_read_verified, self.directory, rel,
                                                     self.manifest)
            pool.shutdown(wait=False)

    def _expand(self, name: str) -> list[str]:
        if name in self.manifest.files:
            return [name]
        return [rel for rel in (f"{name}.json", f"{name}.safetensors")
                if rel in self.manifest.files]

    def _buffer(self, relpath: str) -> Buffer:
        future = self._futures.pop(relpath, None)
        if future is not None:
            return future.result()
        return _read_verified(self.directory, relpath, self.manifest)

    def tensors(self, relpath: str) -> dict[str, torch.Tensor]:
        """Verified tensors of a safetensors file, on CPU (tied aliases restored)."""
        future = self._tensor_futures.pop(relpath, None)
        if future is not None:
            return future.result()[0]
        if relpath in self._futures:  # prefetched whole (a name without the usual suffix)
            return _st.parse(self._buffer(relpath), str(self.directory / relpath))[0]
        return _tensors_verified(self.directory, relpath, self.manifest)[0]

    def json(self, relpath: str) -> Any:
        """Verified, parsed JSON file."""
        buf = self._buffer(relpath)
        path = self.directory / relpath
        foreign = _st.describe_foreign(buf)
        try:
            if foreign:
                raise ValueError(foreign)
            return json.loads(bytes(buf).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CheckpointError(f"{path} is not valid JSON: {exc}", path=path) from None

    def component(self, relpath: str) -> Any:
        """``.safetensors`` -> dict of tensors, ``.json`` -> parsed JSON, else bytes."""
        if relpath.endswith(".safetensors"):
            return self.tensors(relpath)
        if relpath.endswith(".json"):
            return self.json(relpath)
        return bytes(self._buffer(relpath))

    def state(self, stem: str) -> Any:
        """A state written by :func:`.format.write_state` (``<stem>.json``)."""
        path = self.directory / f"{stem}.json"
        doc = self.json(f"{stem}.json")
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or "state" not in doc:
            raise CheckpointError(f"{path} is not an accel state file (expected an object with "
                                  f"\"format\": \"{STATE_FORMAT}\")", path=path)
        tensor_file = doc.get("tensors")
        tensors: Mapping[str, torch.Tensor] = {}
        if tensor_file is not None:
            if not isinstance(tensor_file, str):
                raise CheckpointError(f"{path}: \"tensors\" must be a file name or null",
                                      path=path)
            tensors = self.tensors(tensor_file)
        try:
            return decode(doc["state"], tensors)
        except ValueError as exc:
            raise CheckpointError(f"{path} (with its tensors {tensor_file}) is malformed: {exc}",
                                  path=path) from exc


def load_tensors(directory: str | Path, relpath: str,
                 manifest: Manifest | None = None) -> dict[str, torch.Tensor]:
    """Verified tensors of a safetensors component, on CPU (tied aliases restored)."""
    return CheckpointReader(directory, manifest=manifest).tensors(relpath)


def load_json(directory: str | Path, relpath: str, manifest: Manifest | None = None) -> Any:
    """Verified, parsed JSON component."""
    return CheckpointReader(directory, manifest=manifest).json(relpath)


def load_component(directory: str | Path, relpath: str, manifest: Manifest | None = None) -> Any:
    """Load one file of a checkpoint after checking its size and sha256 against the manifest.

    ``.safetensors`` -> dict of CPU tensors, ``.json`` -> parsed JSON, anything else -> bytes.

    Raises:
        CheckpointError: naming the file when it is unlisted, missing, corrupt or unreadable.
    """
    return CheckpointReader(directory, manifest=manifest).component(relpath)


def read_state(directory: str | Path, stem: str, manifest: Manifest | None = None) -> Any:
    """Read back a component written by :func:`accel.checkpoint.storage.format.write_state`.

    Raises:
        CheckpointError: naming the file when it is missing, corrupt or malformed.
    """
    return CheckpointReader(directory, manifest=manifest).state(stem)
