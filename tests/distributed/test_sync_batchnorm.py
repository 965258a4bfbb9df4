"""SyncBatchNorm global vs node, on CPU over gloo: 4 processes laid out as 2 "nodes" x 2.

The nodes are mapped round robin (node 0 = ranks 0 and 2, node 1 = ranks 1 and 3, as ``mpirun``
may place them), so nothing may assume that a node's ranks are contiguous. Every result is
compared with a single-process BatchNorm over the concatenated batch of the ranks it should
span (fp32 tolerances).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.spawn import run_workers

WORLD, PER_RANK, CHANNELS, LENGTH = 4, 3, 3, 5


def _round_robin_nodes(rank: int, world: int, port: int) -> dict[str, str]:
    """torchrun's variables for 2 nodes of 2 processes, node = rank % 2."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank // 2),
            "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank % 2), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(WORLD * PER_RANK, CHANNELS, LENGTH, generator=gen) * 3 + 1
    upstream = torch.randn(WORLD * PER_RANK, CHANNELS, LENGTH, generator=gen)
    return x, upstream


def _rows(ranks: list[int]) -> list[int]:
    return [r * PER_RANK + i for r in ranks for i in range(PER_RANK)]


def _init(layer: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
        layer.bias.copy_(torch.linspace(-0.3, 0.3, CHANNELS))
    return layer


def _step(layer: torch.nn.Module, ranks: list[int], mine: int) -> dict[str, torch.Tensor]:
    """Two training forwards (running statistics move twice) and a backward of the second, on
    ``mine``'s rows; ``ranks`` are the processes the layer spans (for the reference)."""
    x_all, up_all = _data()
    rows = _rows([mine])
    for _ in range(2):
        x = x_all[rows].clone().requires_grad_(True)
        layer.zero_grad()
        y = layer(x)
    (y * up_all[rows]).sum().backward()
    return {"y": y.detach(), "dx": x.grad, "dw": layer.weight.grad.clone(),
            "db": layer.bias.grad.clone(), "mean": layer.running_mean.clone(),
            "var": layer.running_var.clone()}


def _reference(ranks: list[int], mine: int) -> dict[str, torch.Tensor]:
    """Single-process BatchNorm over the concatenated batch of ``ranks``; ``y``/``dx`` are
    ``mine``'s rows, ``dw``/``db`` the whole batch's (the sum of every rank's local share)."""
    x_all, up_all = _data()
    layer = _init(torch.nn.BatchNorm1d(CHANNELS))
    rows = _rows(ranks)
    for _ in range(2):
        x = x_all[rows].clone().requires_grad_(True)
        layer.zero_grad()
        y = layer(x)
    (y * up_all[rows]).sum().backward()
    at = ranks.index(mine) * PER_RANK
    part = slice(at, at + PER_RANK)
    return {"y": y.detach()[part], "dx": x.grad[part], "dw": layer.weight.grad,
            "db": layer.bias.grad, "mean": layer.running_mean, "var": layer.running_var}


def _check(found: dict[str, torch.Tensor], ranks: list[int], rank: int, group: Any,
           what: str) -> None:
    import torch.distributed as dist

    expected = _reference(ranks, rank)
    for name in ("dw", "db"):  # local shares; summed over the layer's group they are the whole
        dist.all_reduce(found[name], group=group)
    for name, value in expected.items():
        torch.testing.assert_close(found[name], value, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, n=name: f"{what}, {n} on rank {rank}: {m}")


def _group_ranks(group: Any) -> list[int]:
    import torch.distributed as dist

    return list(range(dist.get_world_size())) if group is None else \
        sorted(dist.get_process_group_ranks(group))


def _layers_worker(rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    from accel.distributed.batchnorm import SyncBatchNorm, convert_sync_batchnorm
    from accel.distributed.nodes import node_group
    from accel.run.connector import connect_process

    ctx = connect_process(cpu=True).context
    everyone, node = list(range(WORLD)), [rank % 2, rank % 2 + 2]
    # global: the whole job's batch
    layer = convert_sync_batchnorm(_init(torch.nn.BatchNorm1d(CHANNELS)))
    assert type(layer) is SyncBatchNorm
    _check(_step(layer, everyone, rank), everyone, rank, None, "global")
    # node: this machine's batch; the two nodes' statistics differ
    group = node_group(ctx)
    assert _group_ranks(group) == node, (_group_ranks(group), node)
    layer = convert_sync_batchnorm(_init(torch.nn.BatchNorm1d(CHANNELS)), group)
    found = _step(layer, node, rank)
    _check(found, node, rank, group, "node")
    means: list[Any] = [None] * WORLD
    dist.all_gather_object(means, found["mean"])
    assert torch.equal(means[rank], means[(rank + 2) % WORLD])  # same node, same statistics
    assert not torch.allclose(means[0], means[1])  # the nodes differ
    # eval mode uses the running statistics, without collectives
    layer.eval()
    torch.testing.assert_close(layer(_data()[0][:2]), torch.nn.functional.batch_norm(
        _data()[0][:2], layer.running_mean, layer.running_var, layer.weight, layer.bias))
    return {"node_mean": found["mean"].tolist()}  # plain values cross the result queue


def _horovod_worker(rank: int) -> None:
    import accel.horovod as hvd

    hvd.init()
    everyone, node = list(range(WORLD)), [rank % 2, rank % 2 + 2]
    assert hvd.local_size() == 2
    _check(_step(_init(hvd.SyncBatchNorm(CHANNELS)), everyone, rank), everyone, rank, None,
           "hvd global")
    layer = _init(hvd.SyncBatchNorm(CHANNELS, mode="node"))
    _check(_step(layer, node, rank), node, rank, layer.process_group, "hvd node")
    again = _init(hvd.SyncBatchNorm(CHANNELS, mode="local"))
    _step(again, node, rank)
    assert again.process_group is layer.process_group  # created once per session
    pair = hvd.add_process_set([1, 3])
    if rank in (1, 3):
        layer = _init(hvd.SyncBatchNorm(CHANNELS, process_set=pair))
        _check(_step(layer, [1, 3], rank), [1, 3], rank, layer.process_group, "hvd process set")
    hvd.shutdown()


def _accelerator_worker(rank: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch import nn

    from accel import Accelerator, DistributedDataParallelKwargs
    from accel.distributed.batchnorm import SyncBatchNorm

    node = [rank % 2, rank % 2 + 2]
    pair = dist.new_group([0, 1])
    out: dict[str, Any] = {}
    for mode in ("node", "global", False):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv1d(CHANNELS, CHANNELS, 1), nn.BatchNorm1d(CHANNELS),
                              nn.Flatten(), nn.Linear(CHANNELS * LENGTH, 1))
        # DDP's default broadcast_buffers would copy rank 0's running statistics to every rank
        # at each forward: without it each node keeps its own
        keep = DistributedDataParallelKwargs(broadcast_buffers=False)
        accelerator = Accelerator(cpu=True, sync_batchnorm=mode, kwargs_handlers=[keep])
        assert accelerator.sync_batchnorm == mode
        # synchronised already, over ranks 0 and 1: prepare() keeps its group (torch's class
        # cannot train on CPU, so it becomes accel's there)
        kept = nn.SyncBatchNorm(CHANNELS, process_group=pair)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        prepared, optimizer = accelerator.prepare(model, optimizer)
        bn = accelerator.unwrap_model(prepared)[1]
        if mode is False:
            assert type(bn) is nn.BatchNorm1d
        else:
            kept_prepared = accelerator.prepare(nn.Sequential(kept))
            converted = accelerator.unwrap_model(kept_prepared)[0]
            assert type(converted) is SyncBatchNorm and converted.process_group is pair
            assert converted.weight is kept.weight
            assert type(bn) is SyncBatchNorm  # accel's: torch's refuses CPU tensors
            expected = node if mode == "node" else list(range(WORLD))
            assert _group_ranks(bn.process_group) == expected
        x_all, _ = _data()
        x = x_all[_rows([rank])]
        for _ in range(2):
            loss = prepared(x).square().mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        assert torch.isfinite(loss)
        weights: list[Any] = [None] * WORLD
        dist.all_gather_object(weights, prepared.module[0].weight.detach())
        assert all(torch.equal(w, weights[0]) for w in weights)  # DDP kept them in step
        out[str(mode)] = bn.running_mean.tolist()
    return out


def _all_worker(rank: int) -> dict[str, Any]:
    found = _layers_worker(rank)
    _horovod_worker(rank)
    found.update(_accelerator_worker(rank))
    return found


def test_sync_batchnorm_global_node_off_horovod_and_accelerator() -> None:
    results = run_workers(_all_worker, WORLD, env=_round_robin_nodes, timeout=240)
    assert results[0]["node_mean"] == results[2]["node_mean"] != results[1]["node_mean"]
    # through Accelerator.prepare: running statistics per node, global, or per rank
    node, every, off = ([r[mode] for r in results] for mode in ("node", "global", "False"))
    assert node[0] == node[2] != node[1] == node[3]
    assert all(torch.allclose(torch.tensor(m), torch.tensor(every[0])) for m in every)
    assert len({tuple(m) for m in off}) == WORLD
