"""What Accelerate's test scripts import from ``accelerate.test_utils``, for the accel side.

The models and datasets are Accelerate's own (plain torch, no library state), imported from the
installed ``accelerate`` wheel; the helpers that read library state are answered from accel's,
so the swapped scripts never initialise Accelerate's ``PartialState`` beside accel's.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.test_utils.testing import assert_exception  # plain context manager
from accelerate.test_utils.training import RegressionDataset, RegressionModel

from accel.state import AcceleratorState
from accel.utils import gather

__all__ = ["RegressionDataset", "RegressionModel", "are_the_same_tensors", "assert_exception",
           "torch_device"]

#: Accelerate's test_utils picks the accelerator's device type; on this machine it is the CPU.
torch_device = "cuda" if torch.cuda.is_available() else "cpu"


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """True when every process holds a tensor equal to this one (Accelerate's helper)."""
    state = AcceleratorState()
    local = tensor[None].clone().to(state.device)
    everyone: Any = gather(local).cpu()
    mine = local[0].cpu()
    return all(torch.equal(everyone[i], mine) for i in range(everyone.shape[0]))
