"""accel.horovod collectives with real processes over gloo, against single-process references.

One 2-process spawn checks every op (reductions, scaling, the deprecated ``average``, in place
and async, grouped, uneven allgather, broadcast, alltoall, reducescatter, objects, barrier,
join, parameter and optimizer-state broadcast, compression); one 3-process spawn checks a
process set of a subset ([0, 2]) and the uneven splits that need three ranks.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
import torch

from tests.spawn import run_workers


def _count_calls(name: str) -> tuple[list[int], Any]:
    """Count calls of ``torch.distributed.<name>`` (accel.horovod calls it through the module)."""
    import torch.distributed as dist

    calls = [0]
    real = getattr(dist, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    setattr(dist, name, counting)
    return calls, lambda: setattr(dist, name, real)


def _reductions(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    t = torch.tensor([rank + 1.0, 10.0 * rank])  # rank 0: [1, 0]; rank 1: [2, 10]
    out["average"] = hvd.allreduce(t).tolist()
    for name in ("Sum", "Min", "Max", "Product"):
        out[name] = hvd.allreduce(t, op=getattr(hvd, name)).tolist()
    out["untouched"] = t.tolist() == [rank + 1.0, 10.0 * rank]
    # integers: Average truncates toward zero (-5 / 2 -> -2, not floor's -3), as Horovod's
    out["int_avg"] = hvd.allreduce(torch.tensor([-1 - 3 * rank, 1 + 3 * rank])).tolist()
    out["int_dtype"] = str(hvd.allreduce(torch.tensor([1], dtype=torch.int32)).dtype)
    # scaling: before and after the collective
    out["pre_post"] = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0,
                                    postscale_factor=3.0).tolist()
    out["avg_post"] = hvd.allreduce(t, postscale_factor=2.0).tolist()
    out["int_pre"] = hvd.allreduce(torch.tensor([3]), op=hvd.Sum, prescale_factor=0.5).tolist()
    # the deprecated average= form, warned once per session
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["avg_false"] = hvd.allreduce(t, average=False).tolist()
        out["avg_true"] = hvd.allreduce(t, average=True).tolist()
    out["avg_warnings"] = [str(w.category.__name__) for w in caught]
    try:
        hvd.allreduce(t, average=True, op=hvd.Sum)
    except ValueError as e:
        out["avg_and_op"] = str(e)
    # in place
    x = t.clone()
    y = hvd.allreduce_(x, op=hvd.Sum)
    out["inplace"] = (y is x, x.tolist())
    # async + poll + synchronize
    h = hvd.allreduce_async(t, op=hvd.Max)
    while not hvd.poll(h):
        time.sleep(0.001)
    out["async"] = hvd.synchronize(h).tolist()
    x = t.clone()
    h = hvd.allreduce_async_(x, op=hvd.Sum)
    out["async_inplace"] = (hvd.synchronize(h) is x, x.tolist())
    try:
        hvd.synchronize(h)
    except ValueError as e:
        out["used_handle"] = str(e)
    # differentiable: the gradient is reduced the same way
    leaf = torch.full((2,), float(rank + 1), requires_grad=True)
    (hvd.allreduce(leaf * (rank + 1), op=hvd.Sum) * torch.tensor([1.0, 2.0])).sum().backward()
    out["grad"] = leaf.grad.tolist() if leaf.grad is not None else None
    # Adasum: the published rule (one pair), per tensor in a grouped call
    a = torch.randn(5, generator=torch.Generator().manual_seed(rank))
    b = torch.randn(2, 2, generator=torch.Generator().manual_seed(10 + rank))
    out["adasum"] = hvd.allreduce(a, op=hvd.Adasum).tolist()
    out["adasum_grouped"] = [x.tolist() for x in hvd.grouped_allreduce([a, b], op=hvd.Adasum)]
    # compression: float32 in and out, float16 on the wire (the sum of the rounded thirds)
    third = torch.tensor([1.0 / 3.0, 1000.1])
    c = hvd.allreduce(third, op=hvd.Sum, compression=hvd.Compression.fp16)
    out["compressed"] = (str(c.dtype), c.tolist())


def _grouped(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    tensors = [torch.full((2,), rank + 1.0), torch.tensor([rank], dtype=torch.int64),
               torch.full((1, 3), 2.0 * rank)]
    calls, restore = _count_calls("all_reduce")
    try:
        res = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    finally:
        restore()
    out["grouped_calls"] = calls[0]  # one collective per dtype: float32 and int64
    out["grouped"] = [(str(r.dtype), list(r.shape), r.tolist()) for r in res]
    out["grouped_avg"] = [r.tolist() for r in hvd.grouped_allreduce(tensors)]
    copies = [t.clone() for t in tensors]
    returned = hvd.grouped_allreduce_(copies, op=hvd.Max)
    out["grouped_inplace"] = (all(a is b for a, b in zip(returned, copies, strict=True)),
                              [t.tolist() for t in copies])
    h = hvd.grouped_allreduce_async(tensors, op=hvd.Min)
    out["grouped_async"] = [r.tolist() for r in hvd.synchronize(h)]


def _gathers(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    mine = torch.arange((rank + 1) * 2).reshape(rank + 1, 2) + 100 * rank  # uneven dim 0
    out["allgather"] = hvd.allgather(mine).tolist()
    out["allgather_async"] = hvd.synchronize(hvd.allgather_async(mine)).tolist()
    g = hvd.grouped_allgather([mine, torch.tensor([rank == 1] * (2 - rank))])
    out["grouped_allgather"] = [x.tolist() for x in g]
    # broadcast from rank 1, out of place and in place, sync and async
    t = torch.full((2,), float(rank))
    out["bcast"] = (hvd.broadcast(t, root_rank=1).tolist(), t.tolist())
    x = t.clone()
    out["bcast_"] = (hvd.broadcast_(x, 1) is x, x.tolist())
    out["bcast_async"] = hvd.synchronize(hvd.broadcast_async(t, 1)).tolist()
    x = t.clone()
    hvd.synchronize(hvd.broadcast_async_(x, 1))
    out["bcast_async_"] = x.tolist()
    try:
        hvd.broadcast(t, root_rank=2)
    except ValueError as e:
        out["bad_root"] = str(e)
    # alltoall: rank 0 sends [0] to itself and [1, 2] to rank 1; rank 1 sends 3 rows then 1
    if rank == 0:
        send, splits = torch.arange(3), [1, 2]
    else:
        send, splits = torch.arange(4) + 10, torch.tensor([3, 1], dtype=torch.int32)
    got, received = hvd.alltoall(send, splits=splits)
    out["alltoall"] = (got.tolist(), received.tolist(), str(received.dtype))
    even = hvd.alltoall((torch.arange(4) + 10 * rank).reshape(4, 1))
    out["alltoall_even"] = even.tolist()
    a, r = hvd.synchronize(hvd.alltoall_async(send, splits))
    out["alltoall_async"] = (a.tolist(), r.tolist())
    # reducescatter: even (reduce_scatter_tensor) and uneven rows (first ranks get more)
    out["rs_even"] = hvd.reducescatter(torch.arange(4.0) + rank, op=hvd.Sum).tolist()
    uneven = torch.arange(10.0).reshape(5, 2) + rank
    out["rs_uneven"] = hvd.reducescatter(uneven).tolist()
    out["rs_scaled"] = hvd.reducescatter(uneven, op=hvd.Sum, prescale_factor=2.0,
                                         postscale_factor=0.5).tolist()
    out["rs_grouped"] = [x.tolist() for x in hvd.grouped_reducescatter(
        [uneven, torch.ones(2, dtype=torch.int64)], op=hvd.Sum)]
    out["rs_async"] = hvd.synchronize(hvd.reducescatter_async(uneven)).tolist()
    # sparse: indices and values gathered, the result is the sum (or the average)
    dense = torch.zeros(3, 2)
    dense[rank, 1] = rank + 1.0
    dense[2, 0] = 10.0
    for op in ("Sum", "Average"):
        handle = hvd.sparse_allreduce_async(dense.to_sparse(), "s", getattr(hvd, op))
        out[f"sparse_{op}"] = handle().to_dense().tolist()
    # gradients, with Horovod's conventions
    x = torch.ones(rank + 1, requires_grad=True)
    (hvd.allgather(x) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    out["grad_allgather"] = x.grad.tolist() if x.grad is not None else None
    x = torch.full((2,), rank + 1.0, requires_grad=True)
    (hvd.broadcast(x, root_rank=1) * (rank + 1)).sum().backward()
    out["grad_broadcast"] = x.grad.tolist() if x.grad is not None else None
    x = send.float().requires_grad_()
    got, _ = hvd.alltoall(x, splits=splits)
    (got * torch.arange(1.0, got.shape[0] + 1)).sum().backward()
    out["grad_alltoall"] = x.grad.tolist() if x.grad is not None else None
    x = torch.ones(4, requires_grad=True)
    (hvd.reducescatter(x, op=hvd.Sum) * torch.tensor([1.0, 2.0])).sum().backward()
    out["grad_reducescatter"] = x.grad.tolist() if x.grad is not None else None


def _objects_and_sync(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    out["bobj"] = hvd.broadcast_object({"from": rank, "list": [rank]}, root_rank=1)
    out["gobj"] = hvd.allgather_object({"r": rank})
    hvd.barrier()
    # join: the rank that arrives later is the last one (then the other way round)
    for late in (1, 0):
        if rank == late:
            time.sleep(0.5)
        out[f"join_late_{late}"] = hvd.join()
    out["after_join"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).tolist()


def _parameters(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model[1].num_batches_tracked.fill_(7 * rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    out["sd"] = {k: v.tolist() for k, v in model.state_dict().items()}
    torch.manual_seed(10 + rank)
    other = torch.nn.Linear(2, 2)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=0)
    out["named"] = [p.tolist() for p in other.parameters()]
    # a fresh optimizer: hyperparameters follow the root, no step is taken, params untouched
    fresh = torch.optim.Adam(other.parameters(), lr=0.1 * (rank + 1),
                             betas=(0.8 + rank / 10, 0.99), weight_decay=0.5)
    before = [p.detach().clone() for p in other.parameters()]
    hvd.broadcast_optimizer_state(fresh, root_rank=1)
    out["fresh"] = (fresh.param_groups[0]["lr"], list(fresh.param_groups[0]["betas"]),
                    len(fresh.state), all(torch.equal(a, b) for a, b in
                                          zip(before, other.parameters(), strict=True)))
    # an optimizer with state: rank 0 took two steps, rank 1 one, on different data
    adam = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(2 - rank):
        model.train()
        model(torch.randn(4, 3) * (step + rank + 1)).pow(2).sum().backward()
        adam.step()
        adam.zero_grad()
    hvd.broadcast_optimizer_state(adam, root_rank=0)
    out["adam_state"] = {f"{i}.{k}": v.tolist() for i, s in enumerate(adam.state.values())
                         for k, v in s.items()}
    # a non-root rank with state, the root without: the root's (empty) state wins
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if rank == 1:
        model(torch.randn(4, 3)).sum().backward()
        sgd.step()
    hvd.broadcast_optimizer_state(sgd, root_rank=0)
    out["sgd_state_len"] = len(sgd.state)
    # L-BFGS (nested state: lists of tensors, ints) is sent too (Horovod refuses it)
    lin = torch.nn.Linear(2, 1)
    lbfgs = torch.optim.LBFGS(lin.parameters(), lr=0.5, history_size=3)
    if rank == 0:
        data = torch.randn(8, 2)

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            loss = lin(data).pow(2).mean()
            loss.backward()
            return loss

        lbfgs.step(closure)
    hvd.broadcast_optimizer_state(lbfgs, root_rank=0)
    state = next(iter(lbfgs.state.values()))
    out["lbfgs"] = (state["func_evals"], state["n_iter"], len(state["old_dirs"]),
                    [t.tolist() for t in state["old_dirs"]], state["d"].tolist())


def _int16_and_names(rank: int, out: dict[str, Any]) -> None:
    """int16 (gloo has no int16 kernels: carried as int32) and Horovod's duplicate names."""
    import accel.horovod as hvd

    t = torch.tensor([[rank + 1, -(rank + 1)], [10 * rank, 300]], dtype=torch.int16)
    out["i16"] = [(r.dtype == torch.int16, r.tolist()) for r in (
        hvd.allreduce(t, op=hvd.Sum), hvd.broadcast(t, 1), hvd.alltoall(t),
        hvd.reducescatter(t, op=hvd.Sum), hvd.allgather(t))]
    x = t.clone()
    hvd.synchronize(hvd.broadcast_async_(x, 0))
    out["i16_bcast_"] = (x.dtype == torch.int16, x.tolist())
    first = hvd.allreduce_async(t.float(), name="dup")
    try:
        hvd.allreduce_async(t.float(), name="dup")
        out["dup"] = "no error"
    except ValueError as exc:
        out["dup"] = str(exc)
    out["after_dup"] = hvd.synchronize(first).tolist()  # the first one still completes
    out["reused"] = hvd.synchronize(hvd.allreduce_async(t.float(), name="dup",
                                                        op=hvd.Sum)).tolist()


def _pair_worker(rank: int) -> dict[str, Any]:
    import accel.horovod as hvd

    hvd.init()
    out: dict[str, Any] = {"rank": hvd.rank(), "size": hvd.size()}
    _reductions(rank, out)
    _grouped(rank, out)
    _gathers(rank, out)
    _objects_and_sync(rank, out)
    _parameters(rank, out)
    _with_an_accelerator(rank, out)
    _int16_and_names(rank, out)
    hvd.shutdown()
    out["group_after_shutdown"] = torch.distributed.is_initialized()
    return out


def _with_an_accelerator(rank: int, out: dict[str, Any]) -> None:
    """An Accelerator in the same script adopts the group hvd.init() started (and leaves it to
    hvd.shutdown(), which ends it because hvd started it)."""
    import accel.horovod as hvd
    from accel import Accelerator

    accelerator = Accelerator(cpu=True)
    out["accelerator"] = (accelerator.process_index, accelerator.num_processes)
    mine = torch.tensor([float(rank + 1)])
    out["both_reduce"] = (accelerator.reduce(mine.clone(), "sum").item(),
                          hvd.allreduce(mine, op=hvd.Sum).item())
    accelerator.end_training()
    out["group_after_end_training"] = torch.distributed.is_initialized()


def _reference_adasum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The published rule, written out independently of accel.horovod.adasum."""
    a, b = a.double(), b.double()
    dot = (a * b).sum()
    return ((1 - dot / (2 * (a * a).sum())) * a + (1 - dot / (2 * (b * b).sum())) * b).float()


def _check_adasum(r: dict[str, Any]) -> None:
    a = [torch.randn(5, generator=torch.Generator().manual_seed(q)) for q in (0, 1)]
    b = [torch.randn(2, 2, generator=torch.Generator().manual_seed(10 + q)) for q in (0, 1)]
    torch.testing.assert_close(torch.tensor(r["adasum"]), _reference_adasum(*a))
    grouped = [torch.tensor(x) for x in r["adasum_grouped"]]
    torch.testing.assert_close(grouped[0], _reference_adasum(*a))  # dot products per tensor,
    torch.testing.assert_close(grouped[1], _reference_adasum(*b))  # not over the fused buffer


def _check_reductions(r: dict[str, Any]) -> None:
    assert r["average"] == [1.5, 5.0]
    assert r["Sum"] == [3.0, 10.0] and r["Min"] == [1.0, 0.0]
    assert r["Max"] == [2.0, 10.0] and r["Product"] == [2.0, 0.0]
    assert r["untouched"]
    assert r["int_avg"] == [-2, 2] and r["int_dtype"] == "torch.int32"
    assert r["pre_post"] == [18.0, 60.0] and r["avg_post"] == [3.0, 10.0]
    assert r["int_pre"] == [2]  # each rank's 3 becomes int(1.5) = 1 before the sum
    assert r["avg_false"] == [3.0, 10.0] and r["avg_true"] == [1.5, 5.0]
    assert r["avg_warnings"] == ["DeprecationWarning"]
    assert "supersedes average" in r["avg_and_op"]
    assert r["inplace"] == (True, [3.0, 10.0])
    assert r["async"] == [2.0, 10.0] and r["async_inplace"] == (True, [3.0, 10.0])
    assert "already synchronized" in r["used_handle"]
    assert r["grad"] == [(r["rank"] + 1) * 2.0, (r["rank"] + 1) * 4.0]
    fp16_third = float(torch.tensor(1.0 / 3.0).half() * 2)
    assert r["compressed"] == ("torch.float32", [fp16_third, float(torch.tensor(1000.1).half()
                                                                   * 2)])


def _check_grouped(r: dict[str, Any]) -> None:
    assert r["grouped_calls"] == 2
    assert r["grouped"] == [("torch.float32", [2], [3.0, 3.0]), ("torch.int64", [1], [1]),
                            ("torch.float32", [1, 3], [[2.0, 2.0, 2.0]])]
    assert r["grouped_avg"] == [[1.5, 1.5], [0], [[1.0, 1.0, 1.0]]]
    assert r["grouped_inplace"] == (True, [[2.0, 2.0], [1], [[2.0, 2.0, 2.0]]])
    assert r["grouped_async"] == [[1.0, 1.0], [0], [[0.0, 0.0, 0.0]]]


def _check_gathers(r: dict[str, Any]) -> None:
    rank = r["rank"]
    gathered = [[0, 1], [100, 101], [102, 103]]
    assert r["allgather"] == gathered and r["allgather_async"] == gathered
    assert r["grouped_allgather"] == [gathered, [False, False, True]]
    assert r["bcast"] == ([1.0, 1.0], [float(rank)] * 2)
    assert r["bcast_"] == (True, [1.0, 1.0])
    assert r["bcast_async"] == [1.0, 1.0] and r["bcast_async_"] == [1.0, 1.0]
    assert "root must be one of ranks 0..1" in r["bad_root"]
    if rank == 0:
        assert r["alltoall"] == ([0, 10, 11, 12], [1, 3], "torch.int32")
        assert r["alltoall_even"] == [[0], [1], [10], [11]]
    else:
        assert r["alltoall"] == ([1, 2, 13], [2, 1], "torch.int32")
        assert r["alltoall_even"] == [[2], [3], [12], [13]]
    assert r["alltoall_async"] == tuple(r["alltoall"][:2])
    full = (torch.arange(10.0).reshape(5, 2) * 2 + 1)  # the sum over both ranks
    rows = slice(0, 3) if rank == 0 else slice(3, 5)
    assert r["rs_even"] == ([1.0, 3.0] if rank == 0 else [5.0, 7.0])
    assert r["rs_uneven"] == (full[rows] / 2).tolist() and r["rs_async"] == r["rs_uneven"]
    assert r["rs_scaled"] == full[rows].tolist()
    assert r["rs_grouped"] == [full[rows].tolist(), [2]]
    both = torch.tensor([[0.0, 1.0], [0.0, 2.0], [20.0, 0.0]])
    assert r["sparse_Sum"] == both.tolist() and r["sparse_Average"] == (both / 2).tolist()
    assert r["grad_allgather"] == ([1.0] if rank == 0 else [2.0, 3.0])
    assert r["grad_broadcast"] == ([0.0, 0.0] if rank == 0 else [1.5, 1.5])
    assert r["grad_alltoall"] == ([1.0, 1.0, 2.0] if rank == 0 else [2.0, 3.0, 4.0, 3.0])
    assert r["grad_reducescatter"] == [2.0, 4.0, 2.0, 4.0]


def _check_rest(r: dict[str, Any], root_sd: dict[str, Any], root0: dict[str, Any]) -> None:
    assert r["bobj"] == {"from": 1, "list": [1]}
    assert r["gobj"] == [{"r": 0}, {"r": 1}]
    assert r["join_late_1"] == 1 and r["join_late_0"] == 0
    assert r["after_join"] == [2.0]
    assert r["sd"] == root_sd  # buffers too (num_batches_tracked = 7)
    assert r["sd"]["1.num_batches_tracked"] == 7
    assert r["named"] == root0["named"]
    assert r["fresh"] == (0.2, [0.8 + 1 / 10, 0.99], 0, True)
    assert r["adam_state"] == root0["adam_state"]
    assert r["adam_state"]["0.step"] == 2.0
    assert r["sgd_state_len"] == 0
    assert r["lbfgs"] == root0["lbfgs"] and r["lbfgs"][0] > 1


def _check_int16_and_names(r: dict[str, Any]) -> None:
    rank = r["rank"]
    rows = [[[1, -1], [0, 300]], [[2, -2], [10, 300]]]
    summed = [[3, -3], [10, 600]]
    assert r["i16"] == [(True, summed), (True, rows[1]), (True, [rows[0][rank], rows[1][rank]]),
                        (True, [summed[rank]]), (True, rows[0] + rows[1])]
    assert r["i16_bcast_"] == (True, rows[0])
    assert "'allreduce.dup' is already pending" in r["dup"]
    assert r["after_dup"] == [[1.5, -1.5], [5.0, 300.0]]
    assert r["reused"] == [[3.0, -3.0], [10.0, 600.0]]


def test_horovod_ops_two_processes() -> None:
    results = run_workers(_pair_worker, 2, timeout=120)
    for rank, r in enumerate(results):
        assert (r["rank"], r["size"]) == (rank, 2)
        assert r["accelerator"] == (rank, 2) and r["both_reduce"] == (3.0, 3.0)
        assert r["group_after_end_training"] and not r["group_after_shutdown"]
        _check_reductions(r)
        _check_adasum(r)
        _check_grouped(r)
        _check_gathers(r)
        _check_rest(r, results[1]["sd"], results[0])
        _check_int16_and_names(r)


def _trio_worker(rank: int) -> dict[str, Any]:
    import accel.horovod as hvd

    subset = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[subset])
    out: dict[str, Any] = {}
    if rank != 1:
        me = float(rank)
        out["sum"] = hvd.allreduce(torch.tensor([me + 1.0]), op=hvd.Sum,
                                   process_set=subset).tolist()
        out["avg"] = hvd.allreduce(torch.tensor([me]), process_set=subset).tolist()
        out["bcast"] = hvd.broadcast(torch.tensor([me]), root_rank=2,
                                     process_set=subset).tolist()
        try:
            hvd.broadcast(torch.tensor([me]), root_rank=1, process_set=subset)
        except ValueError as e:
            out["root_outside"] = str(e)
        out["gather"] = hvd.allgather(torch.full((rank // 2 + 1,), rank),
                                      process_set=subset).tolist()
        got, received = hvd.alltoall(torch.arange(3) + 10 * rank,
                                     splits=[1, 2] if rank == 0 else [2, 1], process_set=subset)
        out["alltoall"] = (got.tolist(), received.tolist())
        out["rs"] = hvd.reducescatter(torch.arange(3.0), op=hvd.Sum,
                                      process_set=subset).tolist()
        out["obj"] = hvd.broadcast_object(rank, root_rank=2, process_set=subset)
        out["objs"] = hvd.allgather_object(rank, process_set=subset)
        hvd.barrier(process_set=subset)
        out["set_rank"] = (subset.rank(), subset.size())
        try:
            hvd.allreduce(torch.ones(2), op=hvd.Adasum, process_set=subset)
        except NotImplementedError as e:
            out["adasum_set"] = str(e)
    else:
        try:
            hvd.allreduce(torch.tensor([1.0]), process_set=subset)
        except ValueError as e:
            out["not_member"] = str(e)
    # whole job, three ranks: uneven reducescatter rows (2, 2, 1) and even alltoall
    out["rs3"] = hvd.reducescatter(torch.arange(5.0) * (rank + 1), op=hvd.Sum).tolist()
    out["a2a3"] = hvd.alltoall(torch.arange(3) + 10 * rank).tolist()
    try:
        hvd.allreduce(torch.ones(2), op=hvd.Adasum)
    except NotImplementedError as e:
        out["adasum3"] = str(e)
    if rank == 2:
        time.sleep(0.5)
    out["join"] = hvd.join()
    hvd.shutdown()
    return out


def test_horovod_ops_process_set_of_three() -> None:
    results = run_workers(_trio_worker, 3, timeout=120)
    for rank in (0, 2):
        r = results[rank]
        assert r["sum"] == [4.0] and r["avg"] == [1.0] and r["bcast"] == [2.0]
        assert "process set's ranks [0, 2]" in r["root_outside"]
        assert r["gather"] == [0, 2, 2]
        assert r["rs"] == ([0.0, 2.0] if rank == 0 else [4.0])
        assert r["obj"] == 2 and r["objs"] == [0, 2]
        assert r["set_rank"] == (rank // 2, 2)
        assert "global process set only" in r["adasum_set"]
    assert results[0]["alltoall"] == ([0, 20, 21], [1, 2])
    assert results[2]["alltoall"] == ([1, 2, 22], [2, 1])
    assert "not in ProcessSet" in results[1]["not_member"]
    total = torch.arange(5.0) * 6
    assert [r["rs3"] for r in results] == [total[:2].tolist(), total[2:4].tolist(),
                                           total[4:].tolist()]
    assert [r["a2a3"] for r in results] == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    assert [r["join"] for r in results] == [2, 2, 2]
    assert all("power-of-two number of ranks (this job has 3)" in r["adasum3"] for r in results)


@pytest.mark.parametrize("world", [2])
def test_horovod_allreduce_matches_single_process_reference(world: int) -> None:
    """Random tensors: each op over the ranks equals the same op computed in one process."""
    results = run_workers(_random_worker, world, timeout=90)
    inputs = torch.stack([_random_input(rank) for rank in range(world)])
    ref = {"Sum": inputs.sum(0), "Average": inputs.mean(0), "Min": inputs.min(0).values,
           "Max": inputs.max(0).values, "Product": inputs.prod(0)}
    for r in results:
        for name, expected in ref.items():
            torch.testing.assert_close(torch.tensor(r[name]), expected)


def _random_input(rank: int) -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))


def _random_worker(rank: int) -> dict[str, Any]:
    import accel.horovod as hvd

    hvd.init()
    x = _random_input(rank)
    out = {name: hvd.allreduce(x, op=getattr(hvd, name)).tolist()
           for name in ("Sum", "Average", "Min", "Max", "Product")}
    hvd.shutdown()
    return out
