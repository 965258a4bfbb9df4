"""accel.run.rng: the one module that captures, restores and seeds the generators."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from accel import utils
from accel.device import select_device
from accel.run import rng


def _draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def test_capture_restore_round_trips_every_generator() -> None:
    device = select_device(cpu=True)
    state = rng.capture(device)
    first = _draw()
    _draw()
    rng.restore(state, device)
    assert _draw() == first


class _RecordingDevice:
    """A device with a generator of its own (like XLA): capture/restore/seed must reach it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def rng_state(self) -> dict[str, torch.Tensor]:
        return {"seed": torch.tensor([7])}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        self.calls.append(("set", int(state["seed"])))

    def manual_seed(self, seed: int) -> None:
        self.calls.append(("seed", seed))


def test_device_generator_is_captured_restored_and_seeded() -> None:
    device: Any = _RecordingDevice()
    state = rng.capture(device)
    assert torch.equal(state["device"]["seed"], torch.tensor([7]))
    rng.restore(state, device)
    rng.seed_everything(5, device)
    assert device.calls == [("set", 7), ("seed", 5)]


def test_seed_everything_is_set_seed() -> None:
    rng.seed_everything(2**32 + 3)  # numpy takes it modulo 2**32, the others as given
    ours = _draw()
    utils.set_seed(2**32 + 3)
    assert _draw() == ours


def test_rank_seed_is_the_checkpoint_formula() -> None:
    # changing it changes how resumed jobs on more processes are seeded
    assert rng.rank_seed(12, 3) == (12 * 1_000_003 + 3 * 7919 + 12345) % 2**31
    assert rng.rank_seed(12, 3) != rng.rank_seed(12, 2)
    assert 0 <= rng.rank_seed(10**12, 10**6) < 2**31
