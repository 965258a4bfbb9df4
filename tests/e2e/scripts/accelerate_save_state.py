"""Writes real Hugging Face Accelerate ``save_state`` checkpoints (for test_convert_checkpoint.py).

Run: python accelerate_save_state.py OUT_ROOT

Trains a little under Accelerate (one CPU process: two models, AdamW and SGD with momentum, a
StepLR scheduler, a shuffled data loader, a registered object holding a tensor, numpy values and
numbers) and saves the same state twice: OUT_ROOT/safe (safe_serialization=True, the default)
and OUT_ROOT/bin (safe_serialization=False). It then writes OUT_ROOT/reference.safetensors and
OUT_ROOT/reference.json: the values the converted checkpoints must restore, including the
python, numpy and torch random draws that follow the save (the saved RNG streams).

``build()`` and ``Tracker`` are imported by the test to prepare the same objects under accel;
only ``main`` imports accelerate.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: GradScaler settings of the scaler.pt written next to each checkpoint (see main()).
SCALER = {"init_scale": 512.0, "growth_interval": 7}


class Tracker:
    """A registered object: a tensor, numpy scalar and array, numbers and a string."""

    def __init__(self) -> None:
        self.best = np.float64(1e9)
        self.history = torch.zeros(0)
        self.window = np.zeros(3, dtype=np.int32)
        self.count = 0

    def update(self, loss: float) -> None:
        self.best = np.float64(min(float(self.best), loss))
        self.history = torch.cat([self.history, torch.tensor([loss])])
        self.window = np.roll(self.window, 1)
        self.window[0] = self.count
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "history": self.history, "window": self.window,
                "count": self.count, "name": "tracker"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.history = state["best"], state["history"]
        self.window, self.count = state["window"], state["count"]


def build() -> tuple[Any, ...]:
    torch.manual_seed(0)
    model0 = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model1 = nn.Linear(3, 3)
    opt0 = torch.optim.AdamW(model0.parameters(), lr=1e-2)
    opt1 = torch.optim.SGD(model1.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt0, step_size=2, gamma=0.5)
    data = TensorDataset(torch.randn(24, 4), torch.randn(24, 2))
    return model0, model1, opt0, opt1, sched, DataLoader(data, batch_size=4, shuffle=True)


def _reference(acc: Any, objects: tuple[Any, ...], tracker: Tracker, root: Path) -> None:
    model0, model1, opt0, opt1, sched, _ = objects
    tensors: dict[str, torch.Tensor] = {}
    for i, model in enumerate((model0, model1)):
        for key, value in acc.get_state_dict(model).items():
            tensors[f"model_{i}.{key}"] = value.clone()
    for i, opt in enumerate((opt0, opt1)):
        for pid, state in opt.state_dict()["state"].items():
            for key, value in state.items():
                tensors[f"optimizer_{i}.{pid}.{key}"] = value.clone()
    tensors["tracker.history"] = tracker.history.clone()
    doc = {"scheduler_0": sched.state_dict(), "accelerate_step": acc.step,
           "lrs": [[g["lr"] for g in opt.param_groups] for opt in (opt0, opt1)],
           "tracker": {"best": float(tracker.best), "window": tracker.window.tolist(),
                       "count": tracker.count},
           # the draws that follow the save: a restored RNG must produce them again
           "python_draw": random.random(), "numpy_draw": np.random.rand(3).tolist()}
    tensors["torch_draw"] = torch.rand(5)
    save_file(tensors, str(root / "reference.safetensors"))
    (root / "reference.json").write_text(json.dumps(doc))


def main(root: Path) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    objects = acc.prepare(*build())
    model0, model1, opt0, opt1, sched, loader = objects
    tracker = Tracker()
    acc.register_for_checkpointing(tracker)
    for x, y in loader:
        with acc.accumulate(model0):
            loss = F.mse_loss(model0(x), y) + model1(x[:, :3]).pow(2).mean()
            acc.backward(loss)
            opt0.step()
            opt1.step()
            sched.step()
            opt0.zero_grad()
            opt1.zero_grad()
        tracker.update(float(loss))
    acc.save_state(str(root / "safe"))
    acc.save_state(str(root / "bin"), safe_serialization=False)
    # Accelerate keeps a GradScaler only for fp16 on a GPU (it refuses fp16 on the CPU); what it
    # writes then is torch.save(scaler.state_dict(), "scaler.pt"): the same call, CPU scaler.
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    for name in ("safe", "bin"):
        torch.save(scaler.state_dict(), root / name / "scaler.pt")
    _reference(acc, objects, tracker, root)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
