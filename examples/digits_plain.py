"""Train a small CNN on scikit-learn's bundled handwritten digits, in plain PyTorch.

The same loop as ``digits.py`` without accel: one process, or DDP over gloo under torchrun:

    python examples/digits_plain.py
    torchrun --nproc_per_node 2 examples/digits_plain.py

``diff examples/digits_plain.py examples/digits.py`` shows exactly what accel changes.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def digits_datasets(test_size: int = 297) -> tuple[TensorDataset, TensorDataset]:
    """The 1797 8x8 images scaled to [0, 1]; a fixed shuffle splits off ``test_size`` of them."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train, test = order[test_size:], order[:test_size]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train a small CNN on handwritten digits.")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="digits_cnn.pt")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    distributed = "RANK" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("gloo")  # CPU only; GPUs need nccl, set_device and .to(device)
    is_main = not distributed or dist.get_rank() == 0
    torch.manual_seed(args.seed)
    train_set, test_set = digits_datasets()
    train_sampler = DistributedSampler(train_set, seed=args.seed) if distributed else None
    test_sampler = DistributedSampler(test_set, shuffle=False) if distributed else None
    train_dl = DataLoader(train_set, batch_size=args.batch_size, shuffle=train_sampler is None,
                          sampler=train_sampler)
    test_dl = DataLoader(test_set, batch_size=args.batch_size, sampler=test_sampler)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    if distributed:
        model = DistributedDataParallel(model)

    for epoch in range(args.epochs):
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)  # else every epoch sees the same order
        model.train()
        for images, labels in train_dl:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if is_main:
            print(f"epoch {epoch}: loss {loss.item():.4f}")

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in test_dl:
            preds = model(images).argmax(dim=1)
            correct += (preds == labels).sum().item()
            total += labels.numel()
    if distributed:
        # DistributedSampler repeats samples to even out the shards: 297 images count as 298
        counts = torch.tensor([correct, total])
        dist.all_reduce(counts)
        correct, total = counts.tolist()
    if is_main:
        print(f"accuracy {correct / total:.4f} on {total} test images")

    if is_main:
        plain = model.module if distributed else model
        torch.save(plain.state_dict(), args.output)  # a pickle file
        print(f"saved {args.output}")
    if distributed:
        dist.barrier()  # the other processes wait until rank 0 has saved
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
