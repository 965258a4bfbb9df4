"""Accelerate's ``accelerate.utils.random``: seeding and keeping generators in step.

Example:
    >>> import torch
    >>> set_seed(0); a = torch.rand(1)
    >>> set_seed(0); bool(torch.equal(a, torch.rand(1)))
    True
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from ..run import rng
from ..run.rng import seed_everything
from .operations import _comm

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); ``device_specific`` adds the rank.

    Args:
        seed: the seed.
        device_specific: use ``seed + rank`` so that ranks differ.
        deterministic: also ask torch for deterministic algorithms.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if device_specific and dist.is_available() and dist.is_initialized():
        seed += dist.get_rank()
    seed_everything(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_states(rng_types: Iterable[str], generator: torch.Generator | None = None
                           ) -> None:
    """Copy rank 0's state of each named generator to every rank.

    Args:
        rng_types: some of ``"torch"`` (CPU), ``"cuda"``, ``"xla"`` and ``"generator"``.
        generator: the generator that ``"generator"`` means.

    Example:
        >>> synchronize_rng_states(["torch"])  # one process: nothing to copy
    """
    rng.synchronize(rng_types, _comm(), generator)


def synchronize_rng_state(rng_type: str, generator: torch.Generator | None = None) -> None:
    """:func:`synchronize_rng_states` for one generator."""
    rng.synchronize([rng_type], _comm(), generator)


