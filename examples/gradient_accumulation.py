"""Gradient accumulation: one optimizer update per N micro-batches, with ``accumulate()``.

With 2 processes, micro-batches of 8 and ``--accumulation_steps 4`` every update sees
2 x 8 x 4 = 64 images. Inside ``accelerator.accumulate(model)`` the gradients of the micro-steps
are summed locally (DDP does not synchronise them) and ``optimizer.step()`` /
``optimizer.zero_grad()`` / ``scheduler.step()`` only act on the last micro-step of each group
(and on the last batch of the loader, so no gradient is left over).

    accel launch --cpu -n 2 examples/gradient_accumulation.py --accumulation_steps 4

``accel launch --gradient_accumulation_steps 4`` sets the same value for an
``Accelerator()`` created without the argument.
"""

from __future__ import annotations

import argparse
import math

import torch
from digits import build_model, digits_datasets  # the model and data of examples/digits.py
from torch import nn
from torch.utils.data import DataLoader

from accel import Accelerator


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train with gradient accumulation.")
    parser.add_argument("--accumulation_steps", type=int, default=None,
                        help="micro-batches per optimizer update (default: accel launch's "
                        "--gradient_accumulation_steps, else 1)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--micro_batch_size", type=int, default=8, help="per process")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulation_steps)
    steps = accelerator.gradient_accumulation_steps
    torch.manual_seed(args.seed)
    train_set, test_set = digits_datasets()
    train_dl = DataLoader(train_set, batch_size=args.micro_batch_size, shuffle=True)
    test_dl = DataLoader(test_set, batch_size=64)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    # As in Accelerate, describe the schedule of ONE process over the whole data set: a prepared
    # scheduler steps num_processes times per optimizer update, and only on real updates.
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=3e-3, total_steps=args.epochs * math.ceil(len(train_dl) / steps))
    model, optimizer, train_dl, test_dl, scheduler = accelerator.prepare(
        model, optimizer, train_dl, test_dl, scheduler)
    accelerator.print(f"{accelerator.num_processes} processes x micro-batch "
                      f"{args.micro_batch_size} x {steps} accumulation steps = "
                      f"{accelerator.num_processes * args.micro_batch_size * steps} "
                      "images per update")

    micro_batches = updates = 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_dl:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                if accelerator.sync_gradients:  # the last micro-step: gradients are complete
                    accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
                    updates += 1
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            micro_batches += 1
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}, "
                          f"lr {scheduler.get_last_lr()[0]:.2e}")
    accelerator.print(f"{micro_batches} micro-batches, {updates} optimizer updates per process")

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in test_dl:
            preds, labels = accelerator.gather_for_metrics((model(images).argmax(dim=1), labels))
            correct += (preds == labels).sum().item()
            total += labels.numel()
    accelerator.print(f"accuracy {correct / total:.4f} on {total} test images")
    accelerator.end_training()


if __name__ == "__main__":
    main()
