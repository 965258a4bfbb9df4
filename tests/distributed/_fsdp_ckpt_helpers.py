"""Shared pieces of the sharded-checkpoint tests: a small model trained with ``fully_shard``
by hand, and a test-only ``ModelStateIO`` (what the FSDP strategy provides to the protocol)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

DIM = 12
BATCH = 8  # global batch: each of W ranks takes BATCH // W rows


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(DIM, 16)
        self.blocks = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.head = nn.Linear(16, 3)
        self.register_buffer("scale", torch.tensor([0.5, 1.0, 1.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.embed(x))
        for block in self.blocks:
            x = torch.tanh(block(x))
        out: torch.Tensor = self.head(x) * self.scale
        return out


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the global batch of ``step`` (the same data at any world size)."""
    gen = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, DIM, generator=gen), torch.randn(BATCH, 3, generator=gen)
    rows = BATCH // world
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


class ShardIO:
    """The checkpoint protocol's view of an FSDP strategy (until the strategy lands)."""

    distributed_state = True

    def __init__(self, sharded: bool) -> None:
        self.sharded_state = sharded

    def state_module(self, model: nn.Module) -> nn.Module:
        return model

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))

    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor],
                              strict: bool) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        return set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True,
                                                                           strict=strict))


class PlainIO:
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return model.state_dict()

    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor],
                              strict: bool) -> Any:
        return model.load_state_dict(state, strict=strict)


class NoScaler:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def snapshot(model: nn.Module, opt: Any, io: Any, steps: int = 0) -> Any:
    from accel.checkpoint import RunSnapshot
    from accel.device import select_device
    return RunSnapshot(models=(model,), optimizers=(opt,), schedulers=(), loaders=(), custom=(),
                       scaler=NoScaler(), model_io=io, device=select_device(cpu=True),
                       accumulation_step=0, accumulation_steps=1, sync_gradients=True,
                       optimizer_steps=steps, loaded_dir=None)


def build(world: int | None) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The seeded model, sharded over ``world`` ranks (None: a plain module), and its AdamW."""
    torch.manual_seed(0)
    model = Net()
    if world is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int, world: int
          ) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch(step, rank, world)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def full_params(model: nn.Module) -> dict[str, np.ndarray]:
    """Every parameter and buffer, whole (a collective on a sharded model)."""
    out = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = full.detach().numpy().copy()
    return out


def full_optimizer(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """The optimizer's tensors keyed ``fqn.name``, whole (a collective when sharded)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    state = get_optimizer_state_dict(model, opt)["state"]
    out = {}
    for fqn, entry in state.items():
        for name, value in entry.items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            out[f"{fqn}.{name}"] = full.detach().numpy().copy()
    return out


def listing(path: str | Path) -> list[str]:
    root = Path(path)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.lin(x)))


class TiedNet(nn.Module):
    """Input and output projections share one weight; two FSDP units plus the root."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, 16, bias=False)
        self.blocks = nn.Sequential(Block(), Block())
        self.out = nn.Linear(16, DIM, bias=False)
        self.out.weight = nn.Parameter(self.inp.weight.detach().T.contiguous())
        self.tied = nn.Linear(DIM, 16, bias=False)
        self.tied.weight = self.inp.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.blocks(self.inp(x) + self.tied(x)))
        return out


def dataset() -> Any:
    from torch.utils.data import TensorDataset
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, DIM, generator=gen)
    return TensorDataset(x, x.flip(1) * 0.5)
