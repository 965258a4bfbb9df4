"""Run a model bigger than the memory you allow it, with part of its weights on disk.

Builds a small language-model-shaped network, saves it as sharded safetensors (what
``accelerator.save_model`` writes), then loads it again the big-model way: the skeleton is built
under ``init_empty_weights()`` (no memory for weights), ``load_checkpoint_and_dispatch`` infers a
device map under a ``max_memory`` cap and puts what does not fit in an offload folder on disk
(memory-mapped safetensors), and the offloaded blocks are read just before their forward:

    python examples/big_model_inference.py
    accel estimate-memory examples/big_model_inference.py:build_model

The output equals the fully loaded model's, bit for bit.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn

from accel import Accelerator, init_empty_weights, load_checkpoint_and_dispatch


class Block(nn.Module):
    """A residual MLP block: the unit a device map never splits."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 4096, width: int = 256, depth: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as language models often are

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def build_model() -> nn.Module:
    """What ``accel estimate-memory examples/big_model_inference.py:build_model`` sizes."""
    return TinyLM()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Big-model inference with disk offload")
    parser.add_argument("--max_cpu_memory", default="12MiB",
                        help="memory the weights may use on the CPU; the rest goes to disk")
    parser.add_argument("--workdir", default=None, help="where the checkpoint and offload "
                        "folder go (default: a temporary directory)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        full = build_model().eval()
        Accelerator(cpu=True).save_model(full, work / "checkpoint", max_shard_size="5MB")
        size = sum(p.numel() * p.element_size() for p in full.parameters()) / 2**20
        print(f"model: {size:.1f} MiB of weights, saved to {work / 'checkpoint'}")

        with init_empty_weights():
            skeleton = build_model()  # parameters on the meta device: no memory used
        model = load_checkpoint_and_dispatch(
            skeleton, work / "checkpoint", device_map="auto",
            max_memory={"cpu": args.max_cpu_memory}, no_split_module_classes=["Block"],
            offload_folder=work / "offload").eval()
        print("device map:", dict(model.hf_device_map))

        tokens = torch.randint(0, 4096, (4, 32))
        with torch.no_grad():
            same = torch.equal(model(tokens), full(tokens))
        print(f"outputs equal to the fully loaded model's: {same}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
