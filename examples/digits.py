"""Train a small CNN on scikit-learn's bundled handwritten digits, with accel.

Run it on two CPU processes (no GPU, no download), or one process, or under torchrun:

    accel launch --cpu -n 2 examples/digits.py
    python examples/digits.py
    torchrun --nproc_per_node 2 examples/digits.py

``diff examples/digits_plain.py examples/digits.py`` shows exactly what accel changes.
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator


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
    parser.add_argument("--output", default="digits_cnn.safetensors")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator()
    torch.manual_seed(args.seed)
    train_set, test_set = digits_datasets()
    train_dl = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_dl = DataLoader(test_set, batch_size=args.batch_size)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    model, optimizer, train_dl, test_dl = accelerator.prepare(model, optimizer, train_dl, test_dl)

    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_dl:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in test_dl:
            preds = model(images).argmax(dim=1)
            # every test image exactly once: the padding that evens out the shards is dropped
            preds, labels = accelerator.gather_for_metrics((preds, labels))
            correct += (preds == labels).sum().item()
            total += labels.numel()
    accelerator.print(f"accuracy {correct / total:.4f} on {total} test images")

    accelerator.wait_for_everyone()
    accelerator.save(accelerator.unwrap_model(model), args.output)  # main process, safetensors
    accelerator.print(f"saved {args.output}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
