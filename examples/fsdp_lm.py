"""Train a small character-level transformer with sharded data parallelism (FSDP2).

Each process holds half of every parameter, gradient and optimizer state (with 2 processes);
a block's parameters are gathered only while the block computes. The training loop is the
ordinary accel loop: the sharding comes from ``accel launch --use_fsdp`` (or
``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))``). The text is the source code
of Python's own ``textwrap`` module, so nothing is downloaded.

    accel launch --cpu -n 2 --use_fsdp --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Block examples/fsdp_lm.py

At the end it saves a sharded checkpoint (``save_state``: each process writes its shards,
loadable by any number of processes) and the consolidated weights (``save_model``: one
safetensors file, gathered one tensor at a time). Run it again and it resumes from the
checkpoint.
"""

from __future__ import annotations

import argparse
import inspect
import textwrap

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DataLoaderConfiguration, ProjectConfiguration

VOCAB = 256  # bytes


class Progress:
    """The step count, saved in the checkpoint (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


class Block(nn.Module):
    """Causal self-attention and an MLP, each with a residual connection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), 1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class CharLM(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, context: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: stays with the root, never its own unit

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))


def text_windows(context: int) -> TensorDataset:
    data = torch.tensor(list(inspect.getsource(textwrap).encode()), dtype=torch.long)
    count = (len(data) - 1) // context
    inputs = data[: count * context].view(count, context)
    targets = data[1: count * context + 1].view(count, context)
    return TensorDataset(inputs, targets)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--project_dir", default="runs/fsdp_lm")
    parser.add_argument("--model_dir", default="fsdp_lm_model")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=args.project_dir,
                                            automatic_checkpoint_naming=True, total_limit=2),
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    torch.manual_seed(0)
    model = CharLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(text_windows(context=64), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"{accelerator.distributed_type.value}: {accelerator.num_processes} "
                      f"processes, mesh {tuple(accelerator.torch_device_mesh.shape)}")
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    resumed = accelerator.load_state(missing_ok=True)  # any number of processes can load it
    if resumed is not None:
        accelerator.print(f"resumed from {resumed} at step {progress.step}")
    while progress.step < args.steps:
        for tokens, targets in loader:
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if progress.step % 10 == 0:
                mean = accelerator.reduce(loss.detach(), reduction="mean")
                accelerator.print(f"step {progress.step}: loss {mean.item():.4f}")
            if progress.step == args.steps:
                break
    checkpoint = accelerator.save_state()
    accelerator.print(f"saved checkpoint {checkpoint}")
    accelerator.save_model(model, args.model_dir)
    accelerator.print(f"saved {args.model_dir}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
