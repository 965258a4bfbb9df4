"""Offload folders: weights kept on disk as raw memory-mapped files, read one tensor at a time.

An offload folder holds one ``<name>.dat`` file of raw bytes per stored tensor and
``index.json``, which maps every weight name to ``{"dtype", "shape"}`` (Accelerate's format:
either library reads the other's folders); an entry may add ``"file"`` (a name that is not a
safe file name, or a tied weight stored under another name) and ``"offset"`` (bytes to skip).
Nothing is pickled. :class:`OffloadedWeightsLoader` is a read-only mapping over a folder
(and, optionally, an in-memory state dict): each lookup maps that tensor's file privately
(copy-on-write) and hands out a tensor viewing it, so the bytes are paged in when the module runs
and the mapping goes away with the tensor.

Example:
    >>> import tempfile, torch
    >>> folder = tempfile.mkdtemp()
    >>> _ = offload_state_dict(folder, {"w": torch.arange(4.0)})
    >>> OffloadedWeightsLoader(save_folder=folder)["w"]
    tensor([0., 1., 2., 3.])
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["INDEX_FILE", "OffloadedWeightsLoader", "PrefixedDataset", "entry_file",
           "load_offloaded_weight",
           "offload_state_dict", "offload_weight", "read_offload_index", "save_offload_index"]

INDEX_FILE = "index.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _file_name(name: str) -> str:
    return _UNSAFE.sub("_", name) + ".dat"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"offload index names dtype {name!r}, which is not a torch dtype; "
                         "rewrite the offload folder with offload_state_dict()")
    return dtype


def offload_weight(weight: torch.Tensor, weight_name: str, offload_folder: str | Path,
                   index: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write one tensor's raw bytes to ``offload_folder/<weight_name>.dat``; record its dtype
    and shape in ``index`` (Accelerate's offload format, so either library reads the folder).

    Returns:
        ``index`` (a new dict when None was given) with ``weight_name``'s entry added. Call
        :func:`save_offload_index` once all weights are written.
    """
    index = {} if index is None else index
    folder = Path(offload_folder)
    folder.mkdir(parents=True, exist_ok=True)
    file = _file_name(weight_name)
    tensor = weight.detach().to("cpu").contiguous()
    (folder / file).write_bytes(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    entry: dict[str, Any] = {"dtype": str(tensor.dtype).removeprefix("torch."),
                             "shape": list(tensor.shape)}
    if file != f"{weight_name}.dat":  # a name that is not a safe file name
        entry["file"] = file
    index[weight_name] = entry
    return index


def entry_file(name: str, entry: Mapping[str, Any]) -> str:
    """The file of ``name``'s offload index entry, relative to the folder."""
    return str(entry.get("file", f"{name}.dat"))


def save_offload_index(index: Mapping[str, Any], offload_folder: str | Path) -> None:
    """Write (merge into) ``offload_folder/index.json``."""
    path = Path(offload_folder) / INDEX_FILE
    current = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    current.update(index)
    path.write_text(json.dumps(current, indent=1), encoding="utf-8")


def offload_state_dict(save_dir: str | Path, state_dict: Mapping[str, torch.Tensor]
                       ) -> dict[str, Any]:
    """Write every tensor of ``state_dict`` into the offload folder ``save_dir`` (tied tensors,
    i.e. the same storage view under several names, once) and merge its index.

    Returns:
        The index entries written.
    """
    index: dict[str, Any] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in state_dict.items():
        ident = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                 tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if tensor.numel() and not tensor.is_meta and ident in seen:
            first = seen[ident]
            index[name] = {**index[first], "file": entry_file(first, index[first])}
            continue
        seen[ident] = name
        offload_weight(tensor, name, save_dir, index)
    save_offload_index(index, save_dir)
    return index


def load_offloaded_weight(weight_file: str | Path, weight_info: Mapping[str, Any]
                          ) -> torch.Tensor:
    """The tensor described by ``weight_info`` (an index entry), viewing a private mapping of
    ``weight_file``: no read happens until the data is used, writes stay in memory."""
    dtype = _dtype(str(weight_info["dtype"]))
    shape = [int(d) for d in weight_info["shape"]]
    numel = 1
    for dim in shape:
        numel *= dim
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    with open(weight_file, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    return torch.frombuffer(mapped, dtype=dtype, count=numel,
                            offset=int(weight_info.get("offset", 0))).view(shape)


def read_offload_index(folder: str | Path) -> dict[str, Any]:
    """The index of an offload folder ({} when it has none yet)."""
    path = Path(folder) / INDEX_FILE
    if not path.is_file():
        return {}
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a valid offload index ({exc}); delete the offload folder "
                         "and offload again") from None
    if not isinstance(index, dict):
        raise ValueError(f"{path} holds a {type(index).__name__}, expected an object")
    return index


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """A read-only mapping name -> tensor over an in-memory ``state_dict`` and an offload folder.

    Args:
        state_dict: tensors kept in memory (the CPU-offloaded part).
        save_folder: an offload folder; its ``index.json`` is read unless ``index`` is given.
        index: the folder's index entries.
        device: where folder tensors are put (None: the CPU, memory-mapped).

    Tensors from the folder are loaded on each lookup (keep what you use; the mapping caches
    nothing). :meth:`canonical` names the stored tensor behind a name, equal for tied names.
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor] | None = None,
                 save_folder: str | Path | None = None, index: Mapping[str, Any] | None = None,
                 device: torch.device | str | int | None = None) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or both")
        self.state_dict = dict(state_dict or {})
        self.save_folder = None if save_folder is None else Path(save_folder)
        if index is None and self.save_folder is not None:
            index = read_offload_index(self.save_folder)
        self.index = dict(index or {})
        if self.index and self.save_folder is None:
            raise ValueError("an offload index needs the save_folder its files are in")
        self.device = device
        self.loads = 0  # tensors read from the folder so far (benchmarks and tests)
        self._all_keys = list(self.state_dict) + [k for k in self.index
                                                  if k not in self.state_dict]
        self._aliases = _memory_aliases(self.state_dict)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        if key not in self.index:
            raise KeyError(f"{key!r} is neither in the offloaded state dict nor in the offload "
                           f"index of {self.save_folder}")
        assert self.save_folder is not None  # checked in __init__
        entry = self.index[key]
        self.loads += 1
        tensor = load_offloaded_weight(self.save_folder / entry_file(key, entry), entry)
        return tensor if self.device is None else tensor.to(self.device)

    def canonical(self, key: str) -> str:
        """The stored tensor behind ``key`` (the same string for tied names)."""
        if key in self.state_dict:
            return "mem:" + self._aliases.get(key, key)
        entry = self.index.get(key)
        return f"disk:{entry_file(key, entry)}" if entry else key

    def __iter__(self) -> Iterator[str]:
        return iter(self._all_keys)

    def __len__(self) -> int:
        return len(self._all_keys)


def _memory_aliases(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    first: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in state.items():
        if tensor.is_meta or not tensor.numel():
            continue
        ident = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                 tuple(tensor.shape), tensor.stride())
        aliases[name] = first.setdefault(ident, name)
    return aliases


class PrefixedDataset(Mapping[str, torch.Tensor]):
    """The entries of ``dataset`` under ``prefix``, with the prefix removed from the names."""

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def canonical(self, key: str) -> str:
        """The canonical name of the full key (see :meth:`OffloadedWeightsLoader.canonical`)."""
        full = f"{self.prefix}{key}"
        method = getattr(self.dataset, "canonical", None)
        return str(method(full)) if callable(method) else full

    def __iter__(self) -> Iterator[str]:
        return (k[len(self.prefix):] for k in self.dataset if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for k in self.dataset if k.startswith(self.prefix))

