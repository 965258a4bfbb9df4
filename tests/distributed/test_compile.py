"""torch.compile with DDP in two real processes: ``prepare()`` returns
``torch.compile(DDP(model))``; accumulation still skips the all-reduce on micro-steps (the
strategy finds the DDP inside the compile wrapper), training matches one process, checkpoints
hold clean names and load back, ``unwrap_model`` leaves the trained wrapper alone, and regional
compilation compiles the blocks under DDP, as does a module whose forward is torch's own
(``DDP(torch.compile(nn.Sequential))``). One spawn checks all of it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.spawn import run_workers

WORLD = 2
MICRO = 2  # gradient_accumulation_steps
STEPS = 2  # optimizer steps
BACKEND = "inductor"


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x)))


def _model() -> nn.Module:
    torch.manual_seed(3)
    return Net()


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(50 + rank)  # different data on every rank
    return [(torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g))
            for _ in range(MICRO * STEPS)]


def _flat(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


def _reference() -> list[float]:
    """One process, no compile: each step averages every rank's micro-batch gradients."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [_batches(rank) for rank in range(WORLD)]
    for step in range(STEPS):
        for rank in range(WORLD):
            for x, y in data[rank][step * MICRO:(step + 1) * MICRO]:
                (nn.functional.mse_loss(model(x), y) / (MICRO * WORLD)).backward()
        opt.step()
        opt.zero_grad()
    return _flat(model)


def _worker(rank: int, folder: str) -> dict[str, Any]:
    from safetensors import safe_open

    from accel import Accelerator, TorchDynamoPlugin
    from accel.utils import is_compiled_module

    out: dict[str, Any] = {}
    acc = Accelerator(cpu=True, dynamo_backend=BACKEND, gradient_accumulation_steps=MICRO,
                      project_dir=folder)
    net = _model()
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    ddp = model._orig_mod
    out["layers"] = (type(model).__name__, type(ddp).__name__, ddp.module is net)
    synced, start = [], time.perf_counter()
    for x, y in _batches(rank):
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            grads = acc.gather(torch.cat([p.grad.reshape(-1) for p in net.parameters()])[None])
            synced.append(bool(torch.allclose(grads[0], grads[1])))
            opt.step()
            opt.zero_grad()
    out["train_s"] = time.perf_counter() - start
    counters = torch._dynamo.utils.counters  # the graphs dynamo captured and inductor built
    out["compiled"] = (counters["stats"]["unique_graphs"] >= 1, sum(counters["inductor"].values())
                       > 0)
    out["synced"], out["params"] = synced, _flat(net)
    saved = [p.detach().clone() for p in net.parameters()]
    path = Path(acc.save_state())
    with safe_open(str(path / "model_0.safetensors"), "pt") as handle:
        out["keys"] = sorted(handle.keys())
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    acc.load_state(str(path))
    out["restored"] = all(torch.equal(p, q) for p, q in zip(net.parameters(), saved, strict=True))
    kept = acc.unwrap_model(model)
    out["unwrap"] = (is_compiled_module(kept), kept._orig_mod is net, model._orig_mod is ddp,
                     acc.unwrap_model(model, keep_torch_compile=False) is net)
    # Regional compilation under DDP: DDP(copy of the module with compiled blocks).
    regional = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(
        backend="eager", use_regional_compilation=True))
    torch.manual_seed(4)
    blocks = Blocks()
    wrapped = regional.prepare(blocks)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))
    regional.backward(wrapped(x).sum())
    grads = regional.gather(torch.cat([p.grad.reshape(-1) for p in blocks.parameters()])[None])
    out["regional"] = (type(wrapped).__name__, all(is_compiled_module(b)
                                                   for b in wrapped.module.blocks),
                       wrapped.module._orig_mod is blocks, bool(torch.allclose(grads[0],
                                                                                grads[1])),
                       sorted(regional.get_state_dict(wrapped)) == sorted(blocks.state_dict()))
    # nn.Sequential's forward is torch's: dynamo would not compile it inside DDP, so it is
    # compiled before it is wrapped: DDP(torch.compile(seq)).
    torch._dynamo.utils.counters.clear()
    seq = nn.Sequential(nn.Linear(4, 2), nn.Tanh())
    eager = Accelerator(cpu=True, dynamo_backend="eager")
    wrapped = eager.prepare(seq)
    regional.backward(wrapped(x).sum())
    grads = eager.gather(torch.cat([p.grad.reshape(-1) for p in seq.parameters()])[None])
    out["sequential"] = (type(wrapped).__name__, is_compiled_module(wrapped.module),
                         counters["stats"]["unique_graphs"] >= 1,
                         bool(torch.allclose(grads[0], grads[1])),
                         eager.unwrap_model(wrapped) is wrapped.module,
                         eager.unwrap_model(wrapped, keep_torch_compile=False) is seq)
    acc.end_training()
    return out


@pytest.mark.slow
def test_ddp_with_compile_two_processes(tmp_path: Path) -> None:
    start = time.perf_counter()
    results = run_workers(_worker, WORLD, args=(str(tmp_path),), timeout=240)
    print(f"\nDDP + {BACKEND} compile, 2 processes: {time.perf_counter() - start:.1f} s in all; "
          f"training (with compile) {max(r['train_s'] for r in results):.1f} s")
    ref = _reference()
    clean = sorted(_model().state_dict())
    for r in results:
        assert r["layers"] == ("OptimizedModule", "DistributedDataParallel", True)
        assert r["compiled"] == (True, True)
        assert r["synced"] == [False, True] * STEPS  # micro-steps stay local (no_sync)
        assert r["params"] == pytest.approx(ref, abs=1e-5)
        assert r["keys"] == clean and r["restored"]
        assert r["unwrap"] == (True, True, True, True)
        assert r["regional"] == ("DistributedDataParallel", True, True, True, True)
        assert r["sequential"] == ("DistributedDataParallel", True, True, True, True, True)
