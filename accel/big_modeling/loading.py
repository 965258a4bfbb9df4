"""Load a checkpoint into a model tensor by tensor (Accelerate's ``load_checkpoint_in_model``
and ``load_checkpoint_and_dispatch``).

Checkpoints read: a safetensors file, a sharded folder with its ``model.safetensors.index.json``
(what ``save_model`` writes), a folder holding either, and an accel checkpoint directory
(``save_state``: ``model_0.safetensors``). Files are read one tensor at a time (never mapped or read
whole), converted to the requested dtype, and put straight where the device map says: on a
device, or into the offload folder for ``"disk"`` modules.

``torch.save`` files (``pytorch_model.bin``, ``.pt``, with or without
``pytorch_model.bin.index.json``), as transformers and Accelerate read them, are unpickled with
``weights_only=True``: tensors and plain containers only, no code runs; anything else is refused.

Example:
    >>> import tempfile, torch
    >>> from accel.checkpoint.storage import save
    >>> path = tempfile.mkdtemp() + "/model.safetensors"
    >>> save(torch.nn.Linear(2, 2), path)
    >>> model = torch.nn.Linear(2, 2)
    >>> load_checkpoint_in_model(model, path, dtype=torch.float16)
    >>> model.weight.dtype
    torch.float16
"""

from __future__ import annotations

import functools
import io
import json
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._base.warn import warn_user
from ..checkpoint.storage import CheckpointError, read_manifest
from ..checkpoint.storage._st import ALIASES_KEY, DTYPE_NAMES, header_size, parse_header
from .dispatch import dispatch_model
from .hooks import as_device, named_module_tensors, set_module_tensor
from .offload import OffloadedWeightsLoader, entry_file, offload_weight, save_offload_index
from .placement import get_balanced_memory, infer_auto_device_map, unplaced_tensors

__all__ = ["checkpoint_files", "load_checkpoint_and_dispatch", "load_checkpoint_in_model"]

_INDEX = "model.safetensors.index.json"
_PICKLED_INDEX = "pytorch_model.bin.index.json"
#: suffixes of ``torch.save`` files (read with ``weights_only=True``)
_PICKLED = (".bin", ".pt", ".pth", ".ckpt")
_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _index_files(index: Path) -> list[Path]:
    """The files an index names: ``{"weight_map": {name: file}}``, or the bare map (as
    Accelerate also reads)."""
    try:
        found = json.loads(index.read_text(encoding="utf-8"))
        weight_map = found.get("weight_map", found)
        files = sorted(set(weight_map.values()))
        if not all(isinstance(name, str) for name in files):
            raise TypeError("file names must be strings")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{index} is not a valid checkpoint index ({exc}); expected "
                              "{\"weight_map\": {name: file}}", path=index) from None
    for name in files:
        if Path(name).name != name:
            raise CheckpointError(f"{index} points outside its folder: {name!r}", path=index)
    return [index.parent / name for name in files]


def _accel_checkpoint(directory: Path) -> list[Path]:
    manifest = read_manifest(directory)
    models = sorted(rel for rel in manifest.files if rel.startswith("model_")
                    and rel.endswith(".safetensors") and "/" not in rel)
    if len(models) == 1:
        return [directory / models[0]]
    if any(rel.startswith("sharded/model_") for rel in manifest.files):
        raise CheckpointError(f"{directory} holds sharded (FSDP) model state; merge it first with "
                              f"`accel merge-weights {directory} OUT` and load OUT", path=directory)
    raise CheckpointError(f"{directory} holds {len(models)} model files ({models}); pass the one "
                          f"to load, e.g. {directory / 'model_0.safetensors'}", path=directory)


def checkpoint_files(checkpoint: str | Path) -> list[Path]:
    """The files behind ``checkpoint`` (file, index, model folder or accel checkpoint
    directory): safetensors, or ``torch.save`` files (read as tensors only, see :func:`_read`).

    Raises:
        CheckpointError: nothing loadable there.
    """
    path = Path(checkpoint)
    if path.is_file():
        if path.name.endswith(".index.json"):
            return _index_files(path)
        return [path]
    if (path / "manifest.json").is_file():
        return _accel_checkpoint(path)
    for index in (_INDEX, _PICKLED_INDEX):
        if (path / index).is_file():
            return _index_files(path / index)
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return [path / name]
    indexes = sorted(path.glob("*.index.json")) if path.is_dir() else []
    if len(indexes) == 1:
        return _index_files(indexes[0])
    if indexes:
        raise CheckpointError(f"{path} holds several indexes ({[p.name for p in indexes]}); "
                              "pass the one to load", path=path)
    found = sorted(p.name for p in path.iterdir())[:20] if path.is_dir() else "nothing"
    raise CheckpointError(f"no safetensors checkpoint at {path} (found {found}); pass a "
                          f".safetensors file, a folder with {_INDEX} or an accel checkpoint "
                          "directory", path=path)


def _read_tensor(handle: io.RawIOBase, *, start: int, entry: Mapping[str, Any], name: str,
                 path: Path) -> torch.Tensor:
    """One tensor of an open safetensors file, read into fresh memory (one copy)."""
    try:
        out = torch.empty([int(d) for d in entry["shape"]], dtype=DTYPE_NAMES[entry["dtype"]])
        begin, stop = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: entry {name!r} is malformed ({exc!r})", path=path) from None
    if stop - begin != out.numel() * out.element_size():
        raise CheckpointError(f"{path}: entry {name!r} has {stop - begin} bytes, its shape and "
                              f"dtype need {out.numel() * out.element_size()}", path=path)
    if out.numel():
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        handle.seek(start + begin)
        done = 0
        while done < len(view):
            got = handle.readinto(view[done:])
            if not got:
                raise CheckpointError(f"{path} ends inside tensor {name!r}; the file is "
                                      "truncated", path=path)
            done += got
    return out


def _read_pickled(path: Path) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(name, tensor) of a ``torch.save`` state dict, unpickled with ``weights_only=True``
    (tensors and plain containers only: no code runs) and memory-mapped where the file allows."""
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # the legacy (pre-zip) format cannot be mapped
            if "mmap" not in str(exc):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a tensors-only torch.save file ({exc}); accel "
                              "reads such files with weights_only=True, so objects other than "
                              "tensors and plain containers are refused; save the state dict "
                              "with accel.checkpoint.save_model", path=path) from None
    if not isinstance(state, Mapping) or \
            not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict of "
                              "tensors; save model.state_dict() alone", path=path)
    for name, tensor in state.items():
        yield name, functools.partial(lambda t: t, tensor)


def _read(files: Sequence[Path]) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(name, read it) for every tensor of ``files``: nothing is read until asked for, and each
    tensor of a safetensors file is read on its own (files are never mapped or read whole)."""
    for path in files:
        if path.suffix in _PICKLED:
            yield from _read_pickled(path)
            continue
        with open(path, "rb", buffering=0) as handle:
            start = header_size(handle.read(8), str(path))
            handle.seek(0)
            entries, metadata = parse_header(handle.read(start), str(path))
            aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
            names = [(n, n) for n in entries] + [(a, t) for a, t in aliases.items()]
            for name, stored in names:
                yield name, functools.partial(_read_tensor, handle, start=start,
                                              entry=entries[stored], name=name, path=path)


def _dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    found = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"dtype={value!r} is not a torch dtype; pass e.g. torch.float16 or "
                         "'bfloat16'")
    return found


class _Plan:
    """Where each of the model's tensors goes and what it becomes."""

    def __init__(self, model: nn.Module, device_map: Mapping[str, Any] | None,
                 dtype: torch.dtype | None, keep_fp32: Sequence[str], offload_buffers: bool
                 ) -> None:
        self.model, self.device_map, self.dtype = model, device_map, dtype
        self.keep_fp32, self.offload_buffers = list(keep_fp32), offload_buffers
        self.tensors = dict(named_module_tensors(model, recurse=True, remove_non_persistent=True))
        self.params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
        self.groups: dict[int, list[str]] = {}
        for name, tensor in self.tensors.items():
            self.groups.setdefault(id(tensor), []).append(name)
        self.main = "cpu"
        if device_map is not None:
            devices = [d for d in device_map.values() if str(d) not in ("cpu", "disk")]
            self.main = devices[0] if devices else "cpu"

    def where(self, name: str) -> Any:
        current = self.tensors[name]
        if self.device_map is None:
            return "cpu" if current.is_meta else current.device
        owner = max((e for e in self.device_map if e == "" or name == e
                     or name.startswith(e + ".")), key=len)
        place = self.device_map[owner]
        if str(place) == "disk" and name not in self.params and not self.offload_buffers:
            return self.main  # buffers of offloaded modules live on the execution device
        return place

    def convert(self, name: str, value: torch.Tensor) -> torch.Tensor:
        current = self.tensors[name]
        if tuple(value.shape) != tuple(current.shape):
            raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(value.shape)}, the "
                             f"model's has {tuple(current.shape)}; is this the right checkpoint?")
        if not value.is_floating_point():
            return value  # int/bool tensors (ids, masks, counters) keep their dtype
        target = self.dtype if self.dtype is not None else current.dtype
        if any(f".{m}." in f".{name}" for m in self.keep_fp32):
            target = torch.float32
        return value.to(target) if target.is_floating_point else value


def _put(plan: _Plan, *, name: str, value: torch.Tensor, device: Any) -> None:
    """Set ``value`` under every name tied to ``name`` (one object, so ties stay ties)."""
    current = plan.tensors[name]
    data = value.to(as_device(device))
    new: torch.Tensor = nn.Parameter(data, requires_grad=current.requires_grad) \
        if isinstance(current, nn.Parameter) else data
    for alias in plan.groups[id(current)]:
        set_module_tensor(plan.model, alias, new)


def _to_meta(plan: _Plan, name: str) -> None:
    current = plan.tensors[name]
    if current.is_meta:
        return
    meta = nn.Parameter(current.detach().to("meta"), requires_grad=current.requires_grad) \
        if isinstance(current, nn.Parameter) else current.to("meta")
    for alias in plan.groups[id(current)]:
        set_module_tensor(plan.model, alias, meta)


def _report(model: nn.Module, *, missing: list[str], unexpected: list[str], strict: bool) -> None:
    what = []
    if missing:
        what.append(f"missing keys (left as they were): {missing[:20]}")
    if unexpected:
        what.append(f"unexpected keys (ignored): {unexpected[:20]}")
    if not what:
        return
    text = f"the checkpoint does not match {type(model).__name__}: " + "; ".join(what)
    if strict:
        raise ValueError(text + "; check the checkpoint and the model class, or pass strict=False")
    warn_user(text, UserWarning)


def load_checkpoint_in_model(model: nn.Module, checkpoint: str | Path,
                             device_map: Mapping[str, Any] | None = None,
                             offload_folder: str | Path | None = None,
                             dtype: str | torch.dtype | None = None,
                             offload_state_dict: bool | None = None, offload_buffers: bool = False,
                             keep_in_fp32_modules: list[str] | None = None,
                             offload_8bit_bnb: bool = False, strict: bool = False) -> None:
    """Load ``checkpoint`` into ``model`` one tensor at a time, where ``device_map`` says.

    Args:
        model: the model, typically built under ``init_empty_weights()``.
        checkpoint: a safetensors file, an index json, a folder with either, or an accel
            checkpoint directory.
        device_map: module name -> device / ``"cpu"`` / ``"disk"`` (None: each tensor's current
            device, the CPU for meta tensors). ``"disk"`` weights go to ``offload_folder``.
        offload_folder: folder for the ``"disk"`` weights (memory-mapped safetensors + index).
        dtype: floating-point tensors are converted to it (default: the model's dtype);
            integer and bool tensors never are.
        offload_state_dict: stage the CPU weights on disk while loading, so at most one copy is
            in memory (default: when the map has ``"disk"`` parts).
        offload_buffers: offload the buffers of ``"disk"`` modules too.
        keep_in_fp32_modules: modules (name parts) whose floating tensors stay float32.
        offload_8bit_bnb: not supported (bitsandbytes 8-bit weights).
        strict: raise on missing or unexpected keys (both named) instead of warning.
    """
    if offload_8bit_bnb:
        raise NotImplementedError("offload_8bit_bnb=True needs bitsandbytes 8-bit weights, which "
                                  "accel does not support; load unquantised weights")
    if device_map is not None:
        unplaced = unplaced_tensors(model, device_map)
        if unplaced:
            raise ValueError(f"the device map leaves {unplaced[:10]} unplaced; add their modules "
                             "to device_map")
    disk = device_map is not None and "disk" in map(str, device_map.values())
    if disk and offload_folder is None:
        raise ValueError("the device map puts modules on 'disk': pass offload_folder (a folder "
                         "for their weights; it is created)")
    stage = Path(tempfile.mkdtemp(prefix="accel-stage-")) if (
        disk if offload_state_dict is None else offload_state_dict) else None
    plan = _Plan(model, device_map, _dtype(dtype), keep_in_fp32_modules or [], offload_buffers)
    try:
        _load(plan, files=checkpoint_files(checkpoint), folder=offload_folder, stage=stage,
              strict=strict)
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def _load(plan: _Plan, *, files: Sequence[Path], folder: str | Path | None, stage: Path | None,
          strict: bool) -> None:
    index: dict[str, Any] = {}
    staged: dict[str, Any] = {}
    done: set[int] = set()
    unexpected: list[str] = []
    for name, read in _read(files):
        if name not in plan.tensors:
            unexpected.append(name)
            continue
        key = id(plan.tensors[name])
        if key in done:
            continue  # a tied name already loaded under another name
        done.add(key)
        value = plan.convert(name, read())
        places = [plan.where(alias) for alias in plan.groups[key]]
        held = [p for p in places if str(p) != "disk"]
        if len(held) < len(places):  # a "disk" user: the weight goes to the offload folder
            assert folder is not None  # checked by the caller
            offload_weight(value, name, folder, index)
            stored = {**index[name], "file": entry_file(name, index[name])}
            for alias in plan.groups[key]:
                if alias != name:  # a tied name: the same file
                    index[alias] = stored
        if not held:
            _to_meta(plan, name)
        elif stage is not None and str(held[0]) == "cpu":
            offload_weight(value, name, stage, staged)
        else:
            _put(plan, name=name, value=value, device=held[0])
    if index:
        assert folder is not None
        save_offload_index(index, folder)
    if staged:
        save_offload_index(staged, stage)  # type: ignore[arg-type]  # stage is set
        loader = OffloadedWeightsLoader(save_folder=stage, index=staged)
        for name in staged:
            _put(plan, name=name, value=loader[name].clone(), device="cpu")
    missing = [name for name, tensor in plan.tensors.items() if id(tensor) not in done]
    _report(plan.model, missing=missing, unexpected=unexpected, strict=strict)


def _auto_map(model: nn.Module, *, device_map: str, max_memory: Mapping[Any, Any] | None,
              no_split: list[str] | None, dtype: torch.dtype | None,
              offload_buffers: bool) -> dict[str, Any]:
    if device_map not in _AUTO_MAPS:
        raise ValueError(f"device_map={device_map!r} is not one of {_AUTO_MAPS}; pass one of "
                         "them or a dict module name -> device")
    if device_map != "sequential":
        max_memory = get_balanced_memory(
            model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype,
            low_zero=device_map == "balanced_low_0")
    return dict(infer_auto_device_map(
        model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype,
        offload_buffers=offload_buffers))


def load_checkpoint_and_dispatch(
        model: nn.Module, checkpoint: str | Path, device_map: str | Mapping[str, Any] | None = None,
        max_memory: Mapping[Any, Any] | None = None,
        no_split_module_classes: list[str] | None = None,
        offload_folder: str | Path | None = None, offload_buffers: bool = False,
        dtype: str | torch.dtype | None = None, offload_state_dict: bool | None = None,
        skip_keys: str | list[str] | None = None,
        preload_module_classes: list[str] | None = None, force_hooks: bool = False,
        strict: bool = False) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (see :func:`load_checkpoint_in_model`) and dispatch it
    (see :func:`~accel.big_modeling.dispatch_model`).

    ``device_map`` may be a dict, or ``"auto"``/``"balanced"``/``"balanced_low_0"``/
    ``"sequential"`` to infer one from ``max_memory`` (``{0: "10GiB", "cpu": "30GiB"}``).

    Returns:
        ``model``, ready for inference.
    """
    if isinstance(device_map, str):
        device_map = _auto_map(model, device_map=device_map, max_memory=max_memory,
                               no_split=no_split_module_classes,
                               dtype=_dtype(dtype), offload_buffers=offload_buffers)
    if offload_state_dict is None and device_map is not None \
            and "disk" in map(str, device_map.values()):
        offload_state_dict = True
    load_checkpoint_in_model(model, checkpoint, device_map=device_map,
                             offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=offload_state_dict,
                             offload_buffers=offload_buffers, strict=strict)
    if device_map is None:
        return model
    return dispatch_model(model, device_map, offload_dir=offload_folder,
                          offload_buffers=offload_buffers, skip_keys=skip_keys,
                          preload_module_classes=preload_module_classes, force_hooks=force_hooks)
