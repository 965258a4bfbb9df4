"""The file names Accelerate's ``save_state`` writes, and what each one is.

Accelerate (``checkpointing.save_accelerator_state`` and ``save_custom_state``) writes, for the
``i``-th object of each kind (``i`` = 0 has no suffix, then ``_1``, ``_2``, ...)::

    model.safetensors / model_1.safetensors     model weights (safe_serialization=True)
    pytorch_model.bin / pytorch_model_1.bin     model weights (safe_serialization=False)
    optimizer.bin, scheduler.bin                state dicts (torch.save)
    sampler.bin, dl_state_dict.bin              data loader sampler / StatefulDataLoader state
    scaler.pt                                   GradScaler state (fp16 on a GPU)
    random_states_<rank>.pkl                    one per process: python, numpy, torch, device RNG
    custom_checkpoint_<i>.pkl                   register_for_checkpointing objects (no suffix
                                                rule: custom_checkpoint_0.pkl is the first)

FSDP and DeepSpeed write sharded directories and files of their own, which are not converted.

Example:
    >>> [(e.kind, e.index) for e in classify(["optimizer.bin", "model_1.safetensors",
    ...                                        "random_states_3.pkl", "notes.txt"])]
    [('optimizer', 0), ('model', 1), ('rng', 3), ('unknown', 0)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Entry", "classify", "scan"]

_SUFFIX = r"(?:_([1-9]\d*))?"  # Accelerate's "model.x" -> "model_1.x" renaming
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"model{_SUFFIX}\.safetensors"), "model"),
    (re.compile(rf"pytorch_model{_SUFFIX}\.bin"), "model"),
    (re.compile(rf"optimizer{_SUFFIX}\.bin"), "optimizer"),
    (re.compile(rf"scheduler{_SUFFIX}\.bin"), "scheduler"),
    (re.compile(rf"sampler{_SUFFIX}\.bin"), "sampler"),
    (re.compile(rf"dl_state_dict{_SUFFIX}\.bin"), "loader"),
    (re.compile(r"scaler\.pt"), "scaler"),
    (re.compile(r"random_states_(\d+)\.pkl"), "rng"),
    (re.compile(r"custom_checkpoint_(\d+)\.pkl"), "custom"),
    (re.compile(r"(?:pytorch_model_fsdp|model_fsdp).*"), "fsdp"),
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """A top-level file or directory of the Accelerate checkpoint."""

    name: str
    kind: str  # model, optimizer, ..., "fsdp", "directory" or "unknown"
    index: int  # the object's position (model_1 -> 1) or the rank (random_states_3 -> 3)


def _classify(name: str, *, is_dir: bool) -> Entry:
    for pattern, kind in _PATTERNS:
        match = pattern.fullmatch(name)
        if match and (not is_dir or kind == "fsdp"):
            return Entry(name=name, kind=kind,
                         index=int(match.group(1) or 0) if match.groups() else 0)
    return Entry(name=name, kind="directory" if is_dir else "unknown", index=0)


def classify(names: Iterable[str], directories: Iterable[str] = ()) -> list[Entry]:
    """What each name is (in the order given); ``directories`` are names that are folders."""
    folders = set(directories)
    return [_classify(name, is_dir=name in folders) for name in names]


def scan(source: Path) -> list[Entry]:
    """Every top-level entry of ``source``, in name order (hidden names included)."""
    children = sorted(source.iterdir(), key=lambda p: p.name)
    return classify([p.name for p in children], [p.name for p in children if p.is_dir()])
