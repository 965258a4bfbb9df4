"""Single safetensors files and Hugging Face-style sharded model directories.

``save(obj, path)`` always writes safetensors content, whatever the extension (``model.pth``
included), atomically; ``load(path)`` reads it back and refuses pickle/zip files without ever
unpickling them. ``save_model`` writes ``model.safetensors`` or ``model-0000i-of-0000n.safetensors``
shards with ``model.safetensors.index.json``, the names ``transformers`` expects.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "model.pth"
    >>> save(torch.nn.Linear(2, 2), path)
    >>> sorted(load(path))
    ['bias', 'weight']
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..._base.warn import warn_user
from . import _st
from ._io import HashingWriter, fsync_dir, new_token, read_hashed
from .errors import CheckpointError

__all__ = ["INDEX_NAME", "WEIGHTS_NAME", "ModelFilesWriter", "load", "load_model",
           "load_model_state", "parse_size", "plan_shards", "save", "save_model", "save_torch"]

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _state_dict(obj: Any) -> Mapping[str, torch.Tensor]:
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict()
    if isinstance(obj, Mapping):
        return obj
    raise TypeError(f"expected an nn.Module or a dict of tensors, got {type(obj).__name__}; "
                    "for optimizers and other state use Accelerator.save_state")


def _write_atomic(path: Path, tensors: Mapping[str, torch.Tensor],
                  metadata: Mapping[str, str] | None) -> None:
    tmp = path.parent / f".{path.name}.tmp-{new_token()}"
    with HashingWriter(tmp, hashing=False) as out:
        _st.write(out, tensors, metadata)
        out.close()
    os.replace(tmp, path)
    fsync_dir(path.parent)


def save(obj: Any, path: str | Path, metadata: Mapping[str, str] | None = None) -> None:
    """Write a module's state dict (or a dict of tensors) to ``path`` as safetensors, atomically.

    The content is safetensors whatever the extension; tied weights are stored once and come
    back under every name. The file is written under a temporary name, fsynced and renamed.

    Example:
        >>> import tempfile, torch
        >>> save({"w": torch.zeros(3)}, Path(tempfile.mkdtemp()) / "w.safetensors")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, _state_dict(obj), metadata)


def save_torch(obj: Any, path: str | Path) -> None:
    """Write ``obj`` with ``torch.save`` (what Accelerate's ``save`` writes), atomically.

    For scripts that read the file back with ``torch.load``: keep ``obj`` to tensors and plain
    Python values so that ``torch.load(path, weights_only=True)`` reads it without running
    pickled code. The file is written under a temporary name, fsynced and renamed. accel's own
    checkpoints (``save_state``) never use this format.

    Example:
        >>> import tempfile, torch
        >>> path = Path(tempfile.mkdtemp()) / "state.pt"
        >>> save_torch({"epoch": 3, "w": torch.zeros(2)}, path)
        >>> torch.load(path, weights_only=True)["epoch"]
        3
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{new_token()}"
    try:
        with open(tmp, "wb") as out:
            torch.save(obj, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    try:
        buf, _sha = read_hashed(path, hashing=False)
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist", path=path) from None
    except IsADirectoryError:
        raise CheckpointError(f"{path} is a directory; use load_model_state() for model "
                              "directories", path=path) from None
    except OSError as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}", path=path) from exc
    return _st.parse(buf, str(path))


def load(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file (any extension) into CPU tensors; never unpickles.

    Raises:
        CheckpointError: the file is missing, or is not safetensors (a torch.save/pickle file
            is named as such, with how to convert it).
    """
    return _read(Path(path))[0]


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string like ``"200MB"`` (10**6) or ``"5GiB"`` (2**30).

    Example:
        >>> parse_size("5GiB"), parse_size("200MB"), parse_size(1000)
        (5368709120, 200000000, 1000)
    """
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", size)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"cannot parse size {size!r}; expected bytes as an int or a string "
                             "like '500MB', '10GB' or '5GiB'")
        value = int(float(match.group(1)) * _UNITS[unit])
    else:
        raise TypeError(f"size must be an int or a string like '10GB', got {type(size).__name__}")
    if value <= 0:
        raise ValueError(f"size must be positive, got {size!r}")
    return value


def plan_shards(sizes: Mapping[str, int], max_shard_size: int | str) -> list[list[str]]:
    """Names grouped into files of at most ``max_shard_size`` bytes, in order (a tensor larger
    than the limit gets a file of its own), as :func:`save_model` splits a model.

    Example:
        >>> plan_shards({"a": 6, "b": 6, "c": 2}, 10)
        [['a'], ['b', 'c']]
    """
    limit = parse_size(max_shard_size)
    shards: list[list[str]] = [[]]
    current = 0
    for name, size in sizes.items():
        if shards[-1] and current + size > limit:
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += size
    return shards


class ModelFilesWriter:
    """Write a model's weights file by file, the way ``transformers`` names them.

    ``sizes`` (bytes per stored tensor, in order) decide the files up front (see
    :func:`plan_shards`); :meth:`write` each file's tensors as they become available (one file
    held in memory at a time), then :meth:`finish` writes the index (when there are several
    files) and removes stale files of an earlier save. ``aliases`` (tied weights: alias ->
    stored name) are restored on load from the file that holds their target.
    """

    def __init__(self, directory: str | Path, sizes: Mapping[str, int],
                 max_shard_size: int | str = "10GB", aliases: Mapping[str, str] | None = None,
                 metadata: Mapping[str, str] | None = None) -> None:
        self.shards = plan_shards(sizes, max_shard_size)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        n = len(self.shards)
        self.names = [WEIGHTS_NAME] if n == 1 else \
            [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        self.total = sum(sizes.values())
        self.aliases = dict(aliases or {})
        self.metadata = metadata
        self.weight_map: dict[str, str] = {}

    def write(self, index: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Write file ``index`` (its tensors: the names ``self.shards[index]``), atomically."""
        if sorted(tensors) != sorted(self.shards[index]):
            raise ValueError(f"file {index} holds {self.shards[index][:5]}..., got "
                             f"{sorted(tensors)[:5]}...")
        local = {a: tensors[t] for a, t in self.aliases.items() if t in tensors}
        _write_atomic(self.directory / self.names[index], {**tensors, **local}, self.metadata)
        self.weight_map.update(dict.fromkeys(tensors, self.names[index]))

    def finish(self) -> Path:
        """The index (several files) and stale-file removal; returns the file to pass around:
        the single weights file or the index."""
        stale = [p for p in self.directory.iterdir()
                 if (_SHARD.fullmatch(p.name) or p.name in (WEIGHTS_NAME, INDEX_NAME))
                 and p.name not in self.names]
        if len(self.names) > 1:
            index = {"metadata": {"total_size": self.total}, "weight_map": self.weight_map}
            _write_json_atomic(self.directory / INDEX_NAME, index)
            stale = [p for p in stale if p.name != INDEX_NAME]
        for path in stale:  # another machine's writer (save_on_each_node on a shared
            path.unlink(missing_ok=True)  # filesystem) may have removed it first
        return self.directory / (INDEX_NAME if len(self.names) > 1 else WEIGHTS_NAME)


def save_model(model: Any, *, save_directory: str | Path, max_shard_size: int | str = "10GB",
               safe_serialization: bool = True, metadata: Mapping[str, str] | None = None) -> Path:
    """Save weights the way ``transformers`` names them, sharded above ``max_shard_size``.

    Writes ``model.safetensors``, or ``model-00001-of-0000N.safetensors`` shards plus
    ``model.safetensors.index.json`` (``{"metadata": {"total_size": N}, "weight_map": …}``).
    Each file is written atomically; the index last. Stale shards of an earlier save in the
    same directory are removed. Tied weights are stored once (aliases restored on load).

    Returns:
        The file to pass around: the single weights file or the index.
    """
    if not safe_serialization:
        warn_user("save_model(safe_serialization=False) is ignored: accel writes safetensors "
                  "only (pickle files can run code when loaded)")
    stored, aliases = _st.plan(_state_dict(model))
    sizes = {name: t.numel() * t.element_size() for name, t in stored.items()}
    writer = ModelFilesWriter(save_directory, sizes, max_shard_size, aliases, metadata)
    for i, names in enumerate(writer.shards):
        writer.write(i, {name: stored[name] for name in names})
    return writer.finish()


def _write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.parent / f".{path.name}.tmp-{new_token()}"
    with HashingWriter(tmp, hashing=False) as out:
        out.write(json.dumps(value, indent=2).encode("utf-8"))
        out.close()
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _load_index(index: Path) -> dict[str, torch.Tensor]:
    try:
        doc = json.loads(index.read_text(encoding="utf-8"))
        files = sorted(set(doc["weight_map"].values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index} is not a valid safetensors index ({exc}); expected "
                              "{\"weight_map\": {name: file}}", path=index) from None
    state: dict[str, torch.Tensor] = {}
    for name in files:
        if Path(name).name != name:
            raise CheckpointError(f"{index} points outside its directory: {name!r}", path=index)
        state.update(load(index.parent / name))
    missing = sorted(set(doc["weight_map"]) - set(state))
    if missing:
        raise CheckpointError(f"{index} lists tensors its shards lack: {missing[:10]}", path=index)
    return state


def load_model_state(path: str | Path) -> dict[str, torch.Tensor]:
    """State dict from a safetensors file, a sharded index, or a directory holding either.

    Raises:
        CheckpointError: nothing loadable is there (a ``pytorch_model.bin`` is named as pickle).
    """
    path = Path(path)
    if path.is_file():
        return _load_index(path) if path.name.endswith(".index.json") else load(path)
    if (path / INDEX_NAME).is_file():
        return _load_index(path / INDEX_NAME)
    if (path / WEIGHTS_NAME).is_file():
        return load(path / WEIGHTS_NAME)
    found = sorted(p.name for p in path.iterdir())[:20] if path.is_dir() else []
    hint = (" (pytorch_model.bin is a pickle file, which accel never loads; convert it with "
            "torch.load(..., weights_only=True) and accel.checkpoint.save_model)"
            if "pytorch_model.bin" in found else "")
    raise CheckpointError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {path} (found {found}){hint}; "
                          "write one with save_model()", path=path)


def load_model(model: torch.nn.Module, *, directory: str | Path, strict: bool = True) -> Any:
    """Load weights written by :func:`save_model` (or :func:`save`) into ``model``.

    Returns:
        ``model.load_state_dict``'s result (missing and unexpected keys when not strict).
    """
    return model.load_state_dict(load_model_state(directory), strict=strict)
