"""Convert one file of an Accelerate ``save_state`` directory into accel's checkpoint components.

Each handler reads its file (safetensors, or ``torch.load(weights_only=True)`` through
:mod:`._safe`), checks that it holds what Accelerate writes there, queues the accel component on
the :class:`~accel.checkpoint.storage.CheckpointWriter` (which encodes it now and refuses what
cannot be stored without pickle) as its last step, so that a file is queued only for an entry
reported as converted, and returns what it did. Anything that cannot be carried over
raises :class:`NotConvertible` (or :class:`._safe.Unreadable`) with the reason.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ...device.xla import seed_to_tensor
from ..storage import CheckpointError, CheckpointWriter
from ..storage import files as _files
from ._layout import Entry
from ._safe import read_pickled
from .report import CONVERTED, FileResult

__all__ = ["Facts", "NotConvertible", "convert_entry"]

#: torch.compile's prefix of model state-dict keys: Accelerate saves the model as passed to
#: prepare() (before its own DDP wrapping), so a model compiled before prepare() is saved with
#: it; accel stores the user's module's own names. "module." is left alone: Accelerate never
#: saves DDP's wrapper, and a user's top-level submodule may well be called "module".
_COMPILE_PREFIX = "_orig_mod."
#: random_states keys accel carries over (device states of other kinds are dropped, named).
_RNG_KNOWN = {"step", "random_state", "numpy_random_seed", "torch_manual_seed",
              "torch_cuda_manual_seed", "xm_seed"}
_NO_POSITIONS = ("The converted checkpoint holds no data loader positions: load_state() leaves "
                 "the prepared loaders where they are, as Accelerate's load_state() does "
                 "without use_stateful_dataloader")


class NotConvertible(Exception):
    """A readable file whose content accel cannot carry over; the message says why."""


@dataclass(kw_only=True, slots=True)
class Facts:
    """What the handlers learn about the run, for the manifest."""

    world_size: int
    optimizer_steps: int = 0
    accelerate_step: int | None = None
    counts: dict[str, int] = field(default_factory=dict)


def _count(facts: Facts, kind: str, index: int) -> None:
    facts.counts[kind] = max(facts.counts.get(kind, 0), index + 1)


def _mapping(value: Any, what: str, keys: tuple[str, ...] = ()) -> dict[Any, Any]:
    if not isinstance(value, Mapping) or any(k not in value for k in keys):
        need = f" with keys {list(keys)}" if keys else ""
        raise NotConvertible(f"holds a {type(value).__name__}, expected {what}{need}")
    return dict(value)


def _strip_compile_prefix(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor],
                                                                        bool]:
    if not tensors or not all(key.startswith(_COMPILE_PREFIX) for key in tensors):
        return tensors, False
    return {key[len(_COMPILE_PREFIX):]: value for key, value in tensors.items()}, True


def _model(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    if path.suffix == ".safetensors":
        try:
            tensors = _files.load(path)
        except CheckpointError as exc:
            raise NotConvertible(str(exc)) from None
    else:
        tensors = _mapping(read_pickled(path), "a model state dict")
        bad = [k for k, v in tensors.items() if not (isinstance(k, str)
                                                     and isinstance(v, torch.Tensor))]
        if bad:
            raise NotConvertible(f"entries {bad[:5]} are not str -> tensor; expected a model "
                                 "state dict")
    tensors, stripped = _strip_compile_prefix(tensors)
    rel = f"model_{entry.index}.safetensors"
    writer.write_tensors(rel, tensors)
    note = f"; removed torch.compile's prefix {_COMPILE_PREFIX}" if stripped else ""
    return FileResult(file=entry.name, status=CONVERTED, written_as=rel,
                      detail=f"{len(tensors)} tensors{note}")


def _steps(state: Mapping[Any, Any]) -> int | None:
    steps = [int(s["step"]) for s in state.values()
             if isinstance(s, Mapping) and isinstance(s.get("step"), (int, float, torch.Tensor))]
    return max(steps) if steps else None


def _optimizer(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    state = _mapping(read_pickled(path), "an optimizer state dict", ("state", "param_groups"))
    if not isinstance(state["state"], Mapping) or not isinstance(state["param_groups"], list):
        raise NotConvertible("its 'state' is not a dict or its 'param_groups' not a list: not "
                             "an optimizer state dict")
    steps = _steps(state["state"])
    stem = f"optimizer_{entry.index}"
    writer.write_state(stem, state)  # last: a file is queued only for a converted entry
    if steps is not None:
        facts.optimizer_steps = max(facts.optimizer_steps, steps)
    return FileResult(file=entry.name, status=CONVERTED, written_as=stem,
                      detail=f"{len(state['state'])} parameter state(s), "
                      f"{len(state['param_groups'])} group(s)"
                      + (f", step {steps}" if steps is not None else ""))


def _scheduler(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    state = _mapping(read_pickled(path), "a scheduler state dict")
    stem = f"scheduler_{entry.index}"
    writer.write_state(stem, state)
    return FileResult(file=entry.name, status=CONVERTED, written_as=stem,
                      detail=f"last_epoch {state.get('last_epoch', '?')}")


def _scaler(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    state = _mapping(read_pickled(path), "a GradScaler state dict")
    writer.write_state("scaler", state)
    return FileResult(file=entry.name, status=CONVERTED, written_as="scaler",
                      detail=f"scale {state.get('scale', '?')} (used when the run has fp16 mixed "
                      "precision)")


def _custom(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    state = read_pickled(path)
    stem = f"custom_{entry.index}"
    writer.write_state(stem, state)
    what = f"{len(state)} key(s)" if isinstance(state, Mapping) else type(state).__name__
    return FileResult(file=entry.name, status=CONVERTED, written_as=stem,
                      detail=f"registered object {entry.index}'s state ({what})")


def _check_generators(state: dict[str, Any]) -> None:
    """The states are what python, numpy and torch accept (tried on throwaway generators)."""
    numpy_state = state["numpy"]
    if isinstance(numpy_state, tuple) and len(numpy_state) > 1 and \
            isinstance(numpy_state[1], np.ndarray) and numpy_state[1].dtype.hasobject:
        raise NotConvertible("its numpy RNG state is an object array")
    try:
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state(numpy_state)
        torch.Generator().set_state(state["torch"])
    except (TypeError, ValueError, RuntimeError, KeyError, IndexError) as exc:
        raise NotConvertible(f"holds RNG states that python/numpy/torch reject: {exc}") from None


def _device_rng(raw: Mapping[str, Any], rank: int) -> tuple[dict[str, torch.Tensor], str]:
    device: dict[str, torch.Tensor] = {}
    notes = []
    cuda = raw.get("torch_cuda_manual_seed")
    if isinstance(cuda, (list, tuple)) and cuda:
        # get_rng_state_all(): one state per visible GPU; this rank's is its local rank's,
        # which is the rank modulo the GPUs per machine (one process per GPU, ranks by machine).
        pick = rank % len(cuda)
        if not isinstance(cuda[pick], torch.Tensor):
            raise NotConvertible("its torch_cuda_manual_seed entries are not tensors")
        device["cuda"] = cuda[pick]
        notes.append(f"cuda (GPU {pick} of {len(cuda)})")
    if "xm_seed" in raw:
        device["xla_seed"] = seed_to_tensor(int(raw["xm_seed"]))
        notes.append("xla")
    return device, "".join(f", {n}" for n in notes)


def _rng(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    raw = _mapping(read_pickled(path), "Accelerate's RNG states",
                   ("random_state", "numpy_random_seed", "torch_manual_seed"))
    state: dict[str, Any] = {"python": raw["random_state"], "numpy": raw["numpy_random_seed"],
                             "torch": raw["torch_manual_seed"]}
    _check_generators(state)
    device, device_note = _device_rng(raw, entry.index)
    if device:
        state["device"] = device
    stem = f"rank_{entry.index}/rng"
    writer.write_state(stem, state)
    if entry.index == 0 and isinstance(raw.get("step"), int):
        facts.accelerate_step = raw["step"]
    dropped = sorted(str(k) for k in raw if k not in _RNG_KNOWN)
    note = f"; dropped {', '.join(dropped)} (devices accel does not run on)" if dropped else ""
    return FileResult(file=entry.name, status=CONVERTED, written_as=stem,
                      detail=f"rank {entry.index}: python, numpy, torch{device_note}{note}")


def _sampler(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    raise NotConvertible("Accelerate's SeedableRandomSampler (a pickled accelerate object, not "
                         f"read) has no counterpart in accel's data loaders. {_NO_POSITIONS}")


def _loader(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    yielded = ""
    state = read_pickled(path)
    if isinstance(state, Mapping) and isinstance(state.get("_num_yielded"), int):
        yielded = (f"; it had yielded {state['_num_yielded']} batch(es) of its epoch: skip them "
                   f"with accelerator.skip_first_batches(loader, {state['_num_yielded']})")
    raise NotConvertible("a StatefulDataLoader position, which does not map onto accel's data "
                         f"order. {_NO_POSITIONS}{yielded}")


def _fsdp(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    raise NotConvertible("FSDP model state is not converted (not read); merge it into one "
                         "model.safetensors with `accelerate merge-weights` and convert again")


def _directory(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    raise NotConvertible("a directory (sharded FSDP/DeepSpeed state, or what a save_state "
                         "pre-hook wrote): not part of what is converted, not read")


def _unknown(writer: CheckpointWriter, *, path: Path, entry: Entry, facts: Facts) -> FileResult:
    raise NotConvertible("not a file Accelerate's save_state writes; not read")


class _Handler(Protocol):
    def __call__(self, writer: CheckpointWriter, *, path: Path, entry: Entry,
                 facts: Facts) -> FileResult: ...



_HANDLERS: dict[str, _Handler] = {
    "model": _model, "optimizer": _optimizer, "scheduler": _scheduler, "scaler": _scaler,
    "custom": _custom, "rng": _rng, "sampler": _sampler, "loader": _loader, "fsdp": _fsdp,
    "directory": _directory, "unknown": _unknown,
}
#: kinds counted in the manifest, as the protocol names them (checked by load_state)
_COUNTED = {"model": "models", "optimizer": "optimizers", "scheduler": "schedulers",
            "custom": "custom"}


def convert_entry(writer: CheckpointWriter, *, source: Path, entry: Entry, facts: Facts
                  ) -> FileResult:
    """Convert one entry (raises NotConvertible/Unreadable, or TypeError from the codec)."""
    if entry.kind in _COUNTED:  # a skipped one still counts: load_state then names its file
        _count(facts, _COUNTED[entry.kind], entry.index)
    return _HANDLERS[entry.kind](writer, path=source / entry.name, entry=entry, facts=facts)
