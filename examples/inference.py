"""Distributed inference: each process takes a share of the inputs, the results are gathered.

``split_between_processes`` hands every process a contiguous share of a list (or tensor, or
dict of those; shares differ by at most one item), and ``gather_object`` collects every
process's results, in rank order, on all processes. The model is the one ``digits.py`` saved:

    accel launch --cpu -n 2 examples/digits.py
    accel launch --cpu -n 2 examples/inference.py --weights digits_cnn.safetensors
"""

from __future__ import annotations

import argparse
import logging

import torch
from digits import build_model, digits_datasets  # the model and data of examples/digits.py

from accel import Accelerator, get_logger
from accel.utils import gather_object

logger = get_logger(__name__, log_level="INFO")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Classify the digits test set on N processes.")
    parser.add_argument("--weights", default="digits_cnn.safetensors",
                        help="the file examples/digits.py wrote")
    parser.add_argument("--batch_size", type=int, default=64)
    return parser.parse_args()


def main() -> None:
    logging.basicConfig(format="%(message)s")
    args = parse_args()
    accelerator = Accelerator()
    model = build_model()
    accelerator.load_model(model, args.weights)  # safetensors; never unpickles
    model = accelerator.prepare_model(model, evaluation_mode=True)  # on the device, no DDP
    model.eval()

    _, test_set = digits_datasets()
    images, labels = test_set.tensors
    requests = [{"id": i, "image": images[i]} for i in range(len(test_set))]
    with accelerator.split_between_processes(requests) as mine:
        logger.info(f"{len(mine)} images, ids {mine[0]['id']}..{mine[-1]['id']}", in_order=True)
        answers = []
        for start in range(0, len(mine), args.batch_size):
            chunk = mine[start:start + args.batch_size]
            batch = torch.stack([r["image"] for r in chunk]).to(accelerator.device)
            with torch.no_grad():
                preds = model(batch).argmax(dim=1).tolist()
            answers += [{"id": r["id"], "pred": p} for r, p in zip(chunk, preds, strict=True)]

    answers = gather_object(answers)  # every process's list, concatenated in rank order
    assert [a["id"] for a in answers] == list(range(len(test_set)))
    correct = sum(a["pred"] == labels[a["id"]].item() for a in answers)
    accelerator.print(f"{len(answers)} predictions from {accelerator.num_processes} processes, "
                      f"accuracy {correct / len(answers):.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
