"""accel.utils at world size 1 (multi-process collectives: tests/distributed)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from accel import utils


def test_set_seed_reproduces_all_generators() -> None:
    utils.set_seed(123)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    utils.set_seed(123)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    with pytest.raises(TypeError, match="seed must be an int"):
        utils.set_seed("1")  # type: ignore[arg-type]


def test_collectives_without_a_group_are_identity() -> None:
    t = torch.arange(3)
    assert utils.gather(t).tolist() == [0, 1, 2]
    assert utils.gather(torch.tensor(5.0)).tolist() == [5.0]
    assert utils.reduce(torch.tensor([2.0]), "mean").tolist() == [2.0]
    assert utils.gather_object(["a"]) == ["a"]
    assert utils.broadcast_object_list([1]) == [1]
    assert utils.pad_across_processes(t) is t
    assert torch.equal(utils.send_to_device({"x": t}, torch.device("cpu"))["x"], t)
