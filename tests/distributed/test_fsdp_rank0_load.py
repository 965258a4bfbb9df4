"""Rank-0 loading (``cpu_ram_efficient_loading``) over fully_shard, with real processes.

Rank 0 holds the real model; the others build it under ``init_empty_weights`` and receive only
their shards. Each rank's CPU allocations are recorded by torch's profiler (every allocation of
the CPU allocator, with its size, inside DTensor and FSDP too): no rank but 0 may allocate a
tensor the size of a full parameter. The loaded shards must equal a model built normally with
the same seed and sharded the same way.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile

from accel.big_modeling import init_empty_weights
from accel.strategy.rank0_load import (
    CpuRamEfficientLoadingError,
    capture_full_state,
    distribute_from_rank0,
)
from tests.spawn import cpu_group, run_workers


class Net(nn.Module):
    """Embedding (37 rows: uneven shards) tied to the head, blocks, buffers of both kinds.

    Every parameter has more elements than any buffer and than any shard of any parameter."""

    def __init__(self, rows: int = 37, width: int = 24) -> None:
        super().__init__()
        self.embed = nn.Embedding(rows, width)
        self.blocks = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(2))
        self.head = nn.Linear(width, rows, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))
        self.register_buffer("positions", torch.arange(7) * 3, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * self.scale
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h) + self.positions.sum()


def _shard(model: nn.Module, mesh: Any) -> nn.Module:
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _largest_allocation(prof: Any) -> int:
    """The largest single CPU allocation (bytes) the profiler saw."""
    largest, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        size = getattr(node.extra_fields, "alloc_size", None)
        if size is not None:
            largest = max(largest, size)
        stack.extend(node.children)
    return largest


def _load(rank: int, mesh: Any, ctx: Any) -> tuple[nn.Module, int]:
    """Rank 0: real model; other ranks: empty model. Returns the loaded model and the largest
    allocation this rank made from construction to the end of loading."""
    torch.manual_seed(0)
    if rank == 0:
        model = Net()
        full = capture_full_state(model)
        return _shard(model, mesh), _distribute(model, full, ctx)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with init_empty_weights(include_buffers=True):
            model = Net()
        _shard(model, mesh)
        distribute_from_rank0(model, full_state=None, ctx=ctx)
    return model, _largest_allocation(prof)


def _distribute(model: nn.Module, full: dict[str, torch.Tensor], ctx: Any) -> int:
    distribute_from_rank0(model, full_state=full, ctx=ctx)
    return 0


def _compare(model: nn.Module, mesh: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    reference = _shard(Net(), mesh)
    out: dict[str, Any] = {"tied": model.head.weight is model.embed.weight}
    out["params_equal"] = all(
        torch.equal(p.full_tensor(), q.full_tensor())
        for p, q in zip(model.parameters(), reference.parameters(), strict=True))
    out["buffers_equal"] = all(torch.equal(a, b) for a, b in
                               zip(model.buffers(), reference.buffers(), strict=True))
    out["sharded"] = all(isinstance(p, DTensor) for p in model.parameters())
    out["local_rows"] = [p.to_local().shape[0] for p in model.parameters()]
    out["smallest_param_bytes"] = min(p.numel() * p.element_size() for p in model.parameters())
    x = torch.tensor([[1, 5, 36, 0]])
    out["forward_equal"] = torch.equal(model(x), reference(x))
    return out


def _errors(rank: int, mesh: Any, ctx: Any) -> dict[str, str]:
    """Every rank raises the same error (none is left waiting for a send)."""
    out = {}
    cases = {
        "keys": lambda m: {k: v for k, v in capture_full_state(m).items() if k != "scale"}
        | {"extra.weight": torch.zeros(2)},
        "shape": lambda m: capture_full_state(m) | {"blocks.0.weight": torch.zeros(3, 24)},
        "meta": lambda m: capture_full_state(m.to("meta")),
        "none": lambda m: None,
        "tied": capture_full_state,  # rank 0's model below unties its head
    }
    for case, make_state in cases.items():
        with init_empty_weights():
            model = Net()
        if case == "tied" and rank == 0:
            model.head.weight = nn.Parameter(torch.empty(37, 24, device="meta"))
        full = make_state(Net()) if rank == 0 else None
        _shard(model, mesh)
        try:
            distribute_from_rank0(model, full_state=full, ctx=ctx)
        except CpuRamEfficientLoadingError as exc:
            out[case] = str(exc)
    return out


def _one_d_worker(rank: int) -> dict[str, Any]:
    ctx, _, _ = cpu_group()
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    model, largest = _load(rank, mesh, ctx)
    out = _compare(model, mesh)
    out["largest_allocation"] = largest
    out["errors"] = _errors(rank, mesh, ctx)
    return out


def test_rank0_loading_sends_each_rank_only_its_shards() -> None:
    results = run_workers(_one_d_worker, 2, timeout=180)
    for rank, out in enumerate(results):
        assert out["sharded"] and out["tied"], rank
        assert out["params_equal"] and out["buffers_equal"] and out["forward_equal"], rank
    # 37 embedding rows over 2 ranks: 19 and 18 (uneven)
    assert [out["local_rows"][0] for out in results] == [19, 18]
    worker = results[1]
    assert 0 < worker["largest_allocation"] < worker["smallest_param_bytes"], worker
    for out in results:  # the same error on every rank, saying how to fix it
        errors = out["errors"]
        assert set(errors) == {"keys", "shape", "meta", "none", "tied"}, errors
        assert "rank 0: parameters unlike rank 0's (tied on one side only?) ['head.weight']" \
            not in errors["tied"]  # rank 0 agrees with itself; rank 1 names the difference
        assert "rank 1: parameters unlike rank 0's (tied on one side only?) ['head.weight']" \
            in errors["tied"]
        assert "missing keys ['scale']" in errors["keys"]
        assert "unexpected keys ['extra.weight']" in errors["keys"]
        assert "blocks.0.weight [3, 24] (model: [24, 24])" in errors["shape"]
        assert "init_empty_weights() on the other ranks" in errors["meta"]
        assert "meta device" in errors["meta"] and "rank 0 has no state" in errors["none"]
    assert results[0]["errors"] == results[1]["errors"]


def _hsdp_worker(rank: int) -> dict[str, Any]:
    ctx, _, _ = cpu_group()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model, largest = _load(rank, mesh, ctx)
    placements = [repr(p) for p in model.embed.weight.placements]
    out = _compare(model, mesh)
    out["largest_allocation"] = largest
    out["placements"] = placements
    return out


@pytest.mark.slow
def test_rank0_loading_on_a_2x2_hsdp_mesh() -> None:
    results = run_workers(_hsdp_worker, 4, timeout=240)
    for rank, out in enumerate(results):
        assert out["placements"] == ["Replicate()", "Shard(dim=0)"], out
        assert out["params_equal"] and out["buffers_equal"] and out["forward_equal"], rank
        assert out["tied"], rank
        if rank:
            assert 0 < out["largest_allocation"] < out["smallest_param_bytes"], (rank, out)
    # shard coordinate 0 (ranks 0 and 2) holds 19 rows, coordinate 1 (ranks 1 and 3) 18
    assert [out["local_rows"][0] for out in results] == [19, 18, 19, 18]


def _accelerator_worker(rank: int) -> dict[str, Any]:
    """Through Accelerator: rank ≥ 1 builds the model under init_empty_weights; it trains like
    a plain model with the same seed (each rank half of the batch; plain: the whole batch)."""
    from accel import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(cpu_ram_efficient_loading=True)
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    torch.manual_seed(0)
    plain = Net()
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if rank == 0:
            model = Net()
        else:
            with init_empty_weights(include_buffers=True):
                model = Net()
        model = accelerator.prepare(model)
    out: dict[str, Any] = {"largest_allocation": _largest_allocation(prof),
                           "smallest_param_bytes": 24 * 24 * 4,
                           "sharded": all(isinstance(p, DTensor) for p in model.parameters()),
                           "tied": model.head.weight is model.embed.weight}
    full = accelerator.get_state_dict(model)
    if rank == 0:
        out["state_equal"] = (full.keys() == plain.state_dict().keys() and all(
            torch.equal(full[k], v) for k, v in plain.state_dict().items()))
    opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.5))
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    tokens = torch.tensor([[1, 5, 36, 0], [2, 2, 30, 7], [9, 8, 7, 6], [0, 1, 2, 3]])
    half = tokens[2 * rank:2 * rank + 2]
    accelerator.backward(model(half).square().mean())
    opt.step()
    plain(tokens).square().mean().backward()
    plain_opt.step()
    trained = accelerator.get_state_dict(model)
    if rank == 0:
        out["trained_diff"] = max(float((trained[k] - v).abs().max())
                                  for k, v in plain.state_dict().items())
    return out


@pytest.mark.slow
def test_accelerator_rank0_loading_end_to_end() -> None:
    results = run_workers(_accelerator_worker, 2, timeout=240)
    for out in results:
        assert out["sharded"] and out["tied"], out
    assert results[0]["state_equal"], results[0]
    assert results[0]["trained_diff"] < 1e-5, results[0]  # fp32: shard-wise reduction order
    assert 0 < results[1]["largest_allocation"] < results[1]["smallest_param_bytes"], results[1]
