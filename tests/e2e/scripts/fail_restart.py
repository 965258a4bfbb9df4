"""e2e worker: trains 3 epochs, checkpointing every 4 steps; optionally crashes once.

argv: <project dir> <crash step or -1>. On the first attempt (TORCHELASTIC_RESTART_COUNT=0)
rank 1 raises at the crash step; ``accel launch --max_restarts 1`` starts the job again and
``load_state(missing_ok=True)`` resumes from the newest complete checkpoint. Rank 0 prints
``RESULT {...}`` with the final parameters (exact float reprs) and where it resumed from.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DataLoaderConfiguration

EPOCHS = 3
SAVE_EVERY = 4


class Progress:
    """The epoch and global step, saved with every checkpoint."""

    def __init__(self) -> None:
        self.epoch = self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


def prepared_run(project: str) -> tuple[Any, Any, Any, Any, Progress]:
    """The job: a small regression with Adam, a stateful loader (resume mid-epoch exactly) and
    ``Progress`` registered for checkpointing; the same on every attempt."""
    torch.manual_seed(0)
    x = torch.randn(48, 4)
    data = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accelerator = Accelerator(cpu=True, project_dir=project, dataloader_config=(
        DataLoaderConfiguration(use_stateful_dataloader=True)))
    model, optimizer, loader = accelerator.prepare(
        model, optimizer, DataLoader(data, batch_size=4, shuffle=True))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    return accelerator, model, optimizer, loader, progress


def report(accelerator: Any, model: Any, progress: Progress, **fields: Any) -> None:
    """Rank 0 prints ``RESULT {...}``: ``fields``, the steps and the final parameters (exact
    float reprs)."""
    params = [repr(v) for p in accelerator.unwrap_model(model).parameters()
              for v in p.detach().reshape(-1).tolist()]
    if accelerator.is_main_process:
        print("RESULT " + json.dumps({**fields, "steps": progress.step, "params": params}),
              flush=True)


def main() -> None:
    project, crash_step = sys.argv[1], int(sys.argv[2])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    accelerator, model, optimizer, loader, progress = prepared_run(project)
    resumed = accelerator.load_state(missing_ok=True)  # the one line that makes restarts resume
    while progress.epoch < EPOCHS:
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step == crash_step and attempt == 0 and accelerator.process_index == 1:
                raise RuntimeError(f"injected crash at step {progress.step}")
            if progress.step % SAVE_EVERY == 0:
                accelerator.save_state(total_limit=2)
        progress.epoch += 1
    report(accelerator, model, progress, attempt=attempt,
           resumed=os.path.basename(resumed or ""))
    accelerator.end_training()


if __name__ == "__main__":
    main()
