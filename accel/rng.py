"""Random number generators: capture, restore and seed python, numpy, torch and the device.

Layer L3. The one place that knows which generators a training run has, so that a checkpoint
(:mod:`accel.checkpoint.protocol`) and :func:`accel.utils.set_seed` cannot disagree about them.

Example:
    >>> import torch
    >>> from accel.device import select_device
    >>> device = select_device(cpu=True)
    >>> state = capture(device)
    >>> a = torch.rand(2)
    >>> restore(state, device)
    >>> torch.equal(a, torch.rand(2))
    True
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from .device.base import Device

__all__ = ["capture", "rank_seed", "restore", "seed_everything"]

_SEED_MODULUS = 2**31  # rank_seed() values fit every generator's seed type


def capture(device: Device) -> dict[str, Any]:
    """The states of the python, numpy, torch (CPU) and ``device`` generators of this process.

    Device states are copied to the CPU so that they can be written to a file. The result is
    what :func:`restore` takes (it holds tuples and numpy arrays: store it with
    :mod:`accel.checkpoint.storage.codec`, which keeps their types).
    """
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    extra = device.rng_state()
    if extra is not None:
        state["device"] = {k: v.cpu() for k, v in extra.items()}
    return state


def restore(state: dict[str, Any], device: Device) -> None:
    """Put back what :func:`capture` returned (the device part only if it was captured).

    Raises:
        KeyError: ``state`` lacks the python, numpy or torch entry.
    """
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "device" in state:
        device.set_rng_state(state["device"])


def seed_everything(seed: int, device: Device | None = None) -> None:
    """Seed python, numpy and torch (which seeds every CUDA device too) and ``device``.

    ``device`` matters for kinds whose generator torch does not seed (XLA); numpy takes the
    seed modulo 2**32, as its seeds are unsigned 32-bit.
    """
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily
    if device is not None:
        device.manual_seed(seed)


def rank_seed(step: int, rank: int) -> int:
    """A seed for a rank that has no saved RNG state (a job resumed on more processes).

    It depends only on the step and the rank, so a restarted job seeds the same way, and
    ranks differ from each other.

    Example:
        >>> rank_seed(12, 3) == rank_seed(12, 3) != rank_seed(12, 2)
        True
    """
    return (step * 1_000_003 + rank * 7919 + 12345) % _SEED_MODULUS
