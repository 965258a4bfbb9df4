"""Save a checkpoint every k steps and resume after an interruption.

``save_state()`` writes ``<project_dir>/checkpoints/checkpoint_<n>`` atomically (safetensors +
JSON, no pickle) and keeps the newest ``--total_limit``; ``load_state()`` restores the newest
complete one: model, optimizer, scheduler, RNG streams, the data loader's position and any
object registered with ``register_for_checkpointing``. With
``DataLoaderConfiguration(use_stateful_dataloader=True)`` the resumed run continues with the next
unseen batch by itself (no ``skip_first_batches``) and reproduces the uninterrupted run's losses.

    accel launch --cpu -n 2 examples/checkpointing.py --project_dir runs/ckpt --stop_after 13
    accel launch --cpu -n 2 examples/checkpointing.py --project_dir runs/ckpt

The first command stops after step 13 (as if the job had been killed); the second resumes from
the checkpoint of step 12 and finishes. Killing the first one at any moment works the same way,
and with ``accel launch --max_restarts 3`` a crashed job restarts and resumes on its own.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from digits import build_model, digits_datasets  # the model and data of examples/digits.py
from torch import nn
from torch.utils.data import DataLoader

from accel import Accelerator, DataLoaderConfiguration, ProjectConfiguration


class Progress:
    """How far training got; saved with the checkpoint because it is registered."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Checkpoint every k steps; resume on start.")
    parser.add_argument("--project_dir", default="runs/checkpointing")
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--save_every", type=int, default=3)
    parser.add_argument("--total_limit", type=int, default=2)
    parser.add_argument("--stop_after", type=int, default=None,
                        help="stop after this step, as if the job had been killed")
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True,
                                  total_limit=args.total_limit)
    # use_stateful_dataloader: load_state() also restores the loader's position (without it,
    # loaders start their epoch over, as in Accelerate, for scripts that skip batches by hand)
    accelerator = Accelerator(project_config=config, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    torch.manual_seed(args.seed)
    train_set, _ = digits_datasets()
    train_dl = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    model, optimizer, train_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)

    # the newest complete checkpoint under <project_dir>/checkpoints, or None if there is none
    resumed = accelerator.load_state(missing_ok=True)
    if resumed is None:
        accelerator.print("no checkpoint yet: starting from scratch")
    else:
        accelerator.print(f"resumed from {resumed} at step {progress.step}")

    while progress.step < args.max_steps and progress.step != args.stop_after:
        for images, labels in train_dl:  # after load_state: the next unseen batch
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            progress.step += 1
            accelerator.print(f"step {progress.step}: loss {loss.item():.6f}")
            if progress.step % args.save_every == 0:
                accelerator.print(f"saved {accelerator.save_state()}")
            if progress.step in (args.max_steps, args.stop_after):
                break

    if progress.step == args.stop_after:
        accelerator.print(f"stopped after step {progress.step} (simulated interruption)")
    else:
        accelerator.print(f"finished: {progress.step} steps")
    accelerator.end_training()


if __name__ == "__main__":
    main()
