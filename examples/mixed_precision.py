"""Mixed precision: bf16 autocast on the CPU (fp16 or bf16 on GPUs), parameters stay fp32.

``Accelerator(mixed_precision="bf16")`` (or ``accel launch --mixed_precision bf16`` with a bare
``Accelerator()``) runs the prepared model's forward under autocast: matrix multiplications and
convolutions compute in bf16, the outputs come back as fp32, and the optimizer updates fp32
weights. fp16 additionally scales the loss (``torch.amp.GradScaler``); ``accelerator.backward``
and ``optimizer.step`` handle that for you.

    accel launch --cpu -n 2 examples/mixed_precision.py
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from digits import build_model, digits_datasets  # the model and data of examples/digits.py
from torch import nn
from torch.utils.data import DataLoader

from accel import Accelerator


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train with mixed precision.")
    parser.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"], default="bf16")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=32, help="per process")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    torch.manual_seed(args.seed)
    train_set, test_set = digits_datasets()
    train_dl = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_dl = DataLoader(test_set, batch_size=args.batch_size)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    model, optimizer, train_dl, test_dl = accelerator.prepare(model, optimizer, train_dl, test_dl)

    seen: dict[str, Any] = {}

    def record_dtype(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        seen["conv"] = output.dtype

    first_conv = accelerator.unwrap_model(model)[0]
    first_conv.register_forward_hook(record_dtype)
    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_dl:
            logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.print(f"mixed_precision={accelerator.mixed_precision}: convolution output "
                      f"{seen['conv']}, model output {logits.dtype}, parameters "
                      f"{first_conv.weight.dtype}")

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
