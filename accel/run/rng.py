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
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..device import DEVICE_KINDS
from ..device.base import Device

if TYPE_CHECKING:
    from ..distributed import Communicator

__all__ = ["RNG_TYPES", "capture", "rank_seed", "restore", "seed_everything", "synchronize"]

#: Accelerate's rng type names that accel can synchronise (its devices: CPU, CUDA, XLA).
RNG_TYPES = ("torch", "cuda", "xla", "generator")

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


def _device_states(kind: str) -> tuple[Device, dict[str, Any]]:
    cls = DEVICE_KINDS[kind]
    if not cls.available():
        raise RuntimeError(f"cannot synchronise the {kind!r} RNG: no {kind} device is available "
                           "here; drop it from rng_types")
    device = cls()
    return device, {k: v.cpu() for k, v in (device.rng_state() or {}).items()}


def synchronize(rng_types: Iterable[str], comm: Communicator,
                generator: torch.Generator | None = None) -> None:
    """Give every rank rank 0's state of each generator named in ``rng_types``.

    ``torch`` is the CPU generator, ``cuda``/``xla`` the device's, ``generator`` the one passed.

    Raises:
        ValueError: an unknown rng type, or ``generator`` named without a generator.

    Example:
        >>> from accel.distributed import Communicator, ProcessContext
        >>> comm = Communicator(ProcessContext.single())
        >>> synchronize(["torch"], comm)  # one process: nothing to copy
    """
    for name in [str(getattr(t, "value", t)) for t in rng_types]:  # accepts str enum members
        if name not in RNG_TYPES:
            raise ValueError(f"unknown rng type {name!r}; accel synchronises {RNG_TYPES}")
        if name == "torch":
            state = torch.get_rng_state()
            torch.set_rng_state(comm.broadcast(state, 0))
        elif name == "generator":
            if generator is None:
                raise ValueError("rng type 'generator' needs the generator: pass "
                                 "synchronize_rng_states(..., generator=your_generator)")
            generator.set_state(comm.broadcast(generator.get_state(), 0))
        else:
            device, states = _device_states(name)
            device.set_rng_state(comm.broadcast(states, 0))
