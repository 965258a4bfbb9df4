"""Every collective with real processes over gloo: uneven, nested, bool, all reductions."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch

from tests.spawn import cpu_group, run_workers

Pair = namedtuple("Pair", ["pred", "label"])




def _collectives_worker(rank: int) -> dict[str, Any]:
    ctx, comm, group = cpu_group()
    world = ctx.world_size
    out: dict[str, Any] = {"rank": ctx.rank, "world": world, "backend": group.backend}
    # gather: uneven first dims, nested, dtype kept, bool stays bool, 0-d -> (world,)
    n = rank + 1
    data = {
        "x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + 100 * rank,
        "flags": Pair(torch.tensor([rank % 2 == 0] * n), torch.full((n,), rank, dtype=torch.int16)),
        "loss": torch.tensor(float(rank)),
        "empty": torch.zeros(0 if rank == 0 else 2, 2, dtype=torch.float64),
    }
    g = comm.gather(data)
    out["gather_x"] = g["x"].tolist()
    out["gather_x_dtype"] = str(g["x"].dtype)
    out["flags_dtype"] = str(g["flags"].pred.dtype)
    out["flags"] = g["flags"].pred.tolist()
    out["labels"] = g["flags"].label.tolist()
    out["labels_dtype"] = str(g["flags"].label.dtype)
    out["is_pair"] = isinstance(g["flags"], Pair)
    out["loss"] = g["loss"].tolist()
    out["empty_shape"] = list(g["empty"].shape)
    # a large tensor overflows the default capacity: second round must agree on all ranks
    big = torch.full((5000 * (rank + 1),), rank, dtype=torch.int64)
    out["big_counts"] = torch.bincount(comm.gather(big)).tolist()
    # steady state: same shape again fits the remembered capacity
    out["big_again"] = comm.gather(big).shape[0]
    # reduce
    t = torch.tensor([1.0 + rank, 10.0 * rank])
    out["sum"] = comm.reduce(t, "sum").tolist()
    out["mean"] = comm.reduce(t, "mean").tolist()
    out["max"] = comm.reduce({"a": t}, "max")["a"].tolist()
    out["min"] = comm.reduce([t], "min")[0].tolist()
    out["bool_any"] = comm.reduce(torch.tensor([rank == 1, False]), "max").tolist()
    out["int_sum"] = comm.reduce(torch.tensor([rank], dtype=torch.int32), "sum").tolist()
    out["input_untouched"] = t.tolist() == [1.0 + rank, 10.0 * rank]
    # broadcast (in place, nested, mixed dtypes)
    b = {"w": torch.full((2, 2), float(rank)), "m": torch.tensor([rank == 0, rank == 1])}
    comm.broadcast(b, from_process=world - 1)
    out["bcast_w"] = b["w"].tolist()
    out["bcast_m"] = b["m"].tolist()
    objs = [{"rank": rank}] if rank == 0 else [None]
    out["bcast_obj"] = comm.broadcast_object_list(objs)[0]
    out["gather_obj"] = comm.gather_object([f"r{rank}"])
    out["gather_obj_scalar"] = comm.gather_object(rank * 2)
    # pad
    p = comm.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_index=-1)
    out["pad"] = p.tolist()
    p2 = comm.pad_across_processes(torch.ones(2, rank + 1), dim=1, pad_first=True)
    out["pad_first"] = p2.tolist()
    comm.barrier()
    group.close()
    out["closed"] = not torch.distributed.is_initialized()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_collectives(world: int) -> None:
    results = run_workers(_collectives_worker, world)
    for rank, r in enumerate(results):
        assert r["rank"] == rank and r["world"] == world and r["backend"] == "gloo"
        expect_x = []
        for q in range(world):
            expect_x += (torch.arange((q + 1) * 3, dtype=torch.float32).reshape(q + 1, 3)
                         + 100 * q).tolist()
        assert r["gather_x"] == expect_x
        assert r["gather_x_dtype"] == "torch.float32"
        assert r["flags_dtype"] == "torch.bool"
        assert r["flags"] == [q % 2 == 0 for q in range(world) for _ in range(q + 1)]
        assert r["labels"] == [q for q in range(world) for _ in range(q + 1)]
        assert r["labels_dtype"] == "torch.int16" and r["is_pair"]
        assert r["loss"] == [float(q) for q in range(world)]
        assert r["empty_shape"] == [2 * (world - 1), 2]
        assert r["big_counts"] == [5000 * (q + 1) for q in range(world)]
        assert r["big_again"] == sum(5000 * (q + 1) for q in range(world))
        assert r["sum"] == [sum(1.0 + q for q in range(world)), sum(10.0 * q for q in range(world))]
        assert r["mean"] == pytest.approx([x / world for x in r["sum"]])
        assert r["max"] == [float(world), 10.0 * (world - 1)]
        assert r["min"] == [1.0, 0.0]
        assert r["bool_any"] == [True, False]
        assert r["int_sum"] == [sum(range(world))]
        assert r["input_untouched"]
        assert r["bcast_w"] == [[float(world - 1)] * 2] * 2
        assert r["bcast_m"] == [world - 1 == 0, world - 1 == 1]
        assert r["bcast_obj"] == {"rank": 0}
        assert r["gather_obj"] == [f"r{q}" for q in range(world)]
        assert r["gather_obj_scalar"] == [2 * q for q in range(world)]
        assert r["pad"] == [[1.0, 1.0]] * (rank + 1) + [[-1.0, -1.0]] * (world - rank - 1)
        assert r["pad_first"] == [[0.0] * (world - rank - 1) + [1.0] * (rank + 1)] * 2
        assert r["closed"]
