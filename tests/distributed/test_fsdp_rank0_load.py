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
        distribute_from_rank0(model, None, ctx)
    return model, _largest_allocation(prof)


def _distribute(model: nn.Module, full: dict[str, torch.Tensor], ctx: Any) -> int:
    distribute_from_rank0(model, full, ctx)
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
    }
    for case, make_state in cases.items():
        with init_empty_weights():
            model = Net()
        full = make_state(Net()) if rank == 0 else None
        _shard(model, mesh)
        try:
            distribute_from_rank0(model, full, ctx)
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
        assert set(errors) == {"keys", "shape", "meta", "none"}, errors
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
