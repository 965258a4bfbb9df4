"""``hvd.join()`` with Horovod's semantics, with real processes over gloo.

One 2-process spawn runs three join rounds in one session: the issue's scenario (rank 0 joins;
rank 1 reduces, gathers, broadcasts and steps a ``DistributedOptimizer``, with ops issued both
before and after rank 0's join was seen), refused ops that raise ``HorovodInternalError`` on the
active rank without ending the job, the next epoch's round with the roles swapped, a round
without ops, and the no-join path (no key written, results as before). One 3-process spawn
checks two joined ranks, process sets (with and without a joined member, one added during the
round) and the last rank's answer.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from tests.spawn import run_workers


def _model_and_optimizer() -> tuple[torch.nn.Module, Any]:
    import accel.horovod as hvd

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters())
    return model, optimizer


def _local_grads(model: torch.nn.Module, rank: int) -> list[list[Any]]:
    """The gradients of ``rank``'s batch, computed here without any collective."""
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    _loss(ref, rank).backward()
    return [p.grad.tolist() for p in ref.parameters() if p.grad is not None]


def _loss(model: torch.nn.Module, rank: int) -> torch.Tensor:
    x = torch.arange(6.0).reshape(2, 3) * (rank + 1)
    loss: torch.Tensor = model(x).square().sum()
    return loss


def _step(model: torch.nn.Module, optimizer: Any, rank: int) -> list[list[Any]]:
    optimizer.zero_grad()
    _loss(model, rank).backward()
    optimizer.step()
    return [p.grad.tolist() for p in model.parameters() if p.grad is not None]


def _refused(out: dict[str, Any], name: str, call: Any) -> None:
    import accel.horovod as hvd

    try:
        call()
        out[name] = "no error"
    except hvd.HorovodInternalError as exc:
        out[name] = str(exc)


def _active_round_one(out: dict[str, Any], model: torch.nn.Module, optimizer: Any) -> None:
    """Rank 1 while rank 0 has joined (rank 0 joins 0.5 s late: the first two ops are issued
    before it joins, so the watcher publishes them)."""
    import accel.horovod as hvd

    t = torch.tensor([1.0, 2.0])
    early = hvd.allreduce_async(t, op=hvd.Sum)
    _refused(out, "early_max", lambda: hvd.allreduce(t, op=hvd.Max))
    out["early_sum"] = hvd.synchronize(early).tolist()
    out["sum"] = hvd.allreduce(t, op=hvd.Sum).tolist()
    out["avg"] = hvd.allreduce(t).tolist()
    x = t.clone()
    hvd.allreduce_(x, op=hvd.Average)
    out["inplace"] = x.tolist()
    grouped = hvd.grouped_allreduce([t, torch.tensor([4], dtype=torch.int64)], op=hvd.Sum)
    out["grouped"] = [g.tolist() for g in grouped]
    out["gather"] = hvd.allgather(torch.tensor([[1, 2], [3, 4]])).tolist()
    out["bcast"] = hvd.broadcast(torch.tensor([7.0]), root_rank=1).tolist()
    out["bobj"] = hvd.broadcast_object({"epoch": 3}, root_rank=1)
    hvd.barrier()
    out["step"] = _step(model, optimizer, 1)
    _refused(out, "alltoall", lambda: hvd.alltoall(torch.arange(2)))
    _refused(out, "reducescatter", lambda: hvd.reducescatter(torch.ones(2)))
    _refused(out, "bcast_root0", lambda: hvd.broadcast(torch.ones(1), root_rank=0))
    _refused(out, "gobj", lambda: hvd.allgather_object(1))
    _refused(out, "product", lambda: hvd.allreduce(t, op=hvd.Product))
    _refused(out, "syncbn", lambda: hvd.SyncBatchNorm(2)(torch.randn(4, 2)))
    out["after_refusals"] = hvd.allreduce(torch.tensor([3.0]), op=hvd.Sum).tolist()


def _join_state() -> Any:
    """The session's join bookkeeping (None before the fix: the rounds below then fail)."""
    from accel.horovod._session import current

    try:
        from accel.horovod._join_state import joins_of
    except ImportError:
        return None
    return joins_of(current())


def _pair_worker(rank: int) -> dict[str, Any]:
    import accel.horovod as hvd

    hvd.init()
    out: dict[str, Any] = {}
    state = _join_state()
    model, optimizer = _model_and_optimizer()
    out["mine"] = {r: _local_grads(model, r) for r in (0, 1)}
    # no join yet: results as before, and nothing written to the store
    out["plain_sum"] = hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum).tolist()
    out["plain_step"] = _step(model, optimizer, rank)
    out["plain_keys"] = state and state.store.check([state.key(1, "op", 0, 0, rank)])
    # round 1: the scenario
    if rank == 0:
        time.sleep(0.5)
        out["join1"] = hvd.join()
    else:
        _active_round_one(out, model, optimizer)
        out["join1"] = hvd.join()
    # round 2 (next epoch): rank 1 joins first, rank 0 still trains
    if rank == 1:
        out["join2"] = hvd.join()
    else:
        time.sleep(0.2)
        out["sum2"] = hvd.allreduce(torch.tensor([5.0]), op=hvd.Sum).tolist()
        out["step2"] = _step(model, optimizer, 0)
        out["gather2"] = hvd.allgather(torch.tensor([9])).tolist()
        out["join2"] = hvd.join()
    # round 3: nothing happens in between; rank 1 is last
    if rank == 1:
        time.sleep(0.3)
    out["join3"] = hvd.join()
    hvd.barrier()  # every rank has ended round 3: the keys of rounds 1 and 2 are gone
    old = [state.key(g, part) for g in (1, 2) for part in ("joined", "arrivals")]
    old += [state.key(g, "op", 0, seq, r) for g in (1, 2) for seq in range(40) for r in (0, 1)]
    out["old_keys"] = [k for k in old if state.store.check([k])]
    out["round3_keys"] = state.store.check([state.key(3, "joined")])  # kept until round 4
    out["final_sum"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).tolist()
    hvd.shutdown()
    out["watcher_alive"] = state._thread.is_alive()
    return out


def _scaled(grads: list[list[Any]], factor: float) -> list[list[Any]]:
    return [(torch.tensor(g) * factor).tolist() for g in grads]


def _check_round_one(r: dict[str, Any]) -> None:
    for name in ("early_max", "product"):
        assert "rank 0 has called hvd.join()" in r[name], r[name]
        assert "can only take part with zeros" in r[name], r[name]
    assert r["early_max"].startswith("hvd.allreduce: ")
    assert r["early_sum"] == [1.0, 2.0] and r["sum"] == [1.0, 2.0]
    assert r["avg"] == [0.5, 1.0] and r["inplace"] == [0.5, 1.0]  # Average divides by size()
    assert r["grouped"] == [[1.0, 2.0], [4]]
    assert r["gather"] == [[1, 2], [3, 4]]  # no rows from the joined rank
    assert r["bcast"] == [7.0] and r["bobj"] == {"epoch": 3}
    assert r["step"] == _scaled(r["mine"][1], 0.5)
    for name in ("alltoall", "reducescatter", "gobj"):
        assert "rank 0 has called hvd.join()" in r[name], r[name]
        assert "not supported while a rank has joined" in r[name], r[name]
    assert "is the root of this broadcast" in r["bcast_root0"], r["bcast_root0"]
    assert r["syncbn"].startswith("hvd.SyncBatchNorm: rank 0 has called hvd.join()")
    assert r["after_refusals"] == [3.0]


def test_join_two_processes_three_rounds() -> None:
    results = run_workers(_pair_worker, 2, timeout=120)
    for rank, r in enumerate(results):
        both = [(torch.tensor(a) + torch.tensor(b)) / 2
                for a, b in zip(r["mine"][0], r["mine"][1], strict=True)]
        assert r["plain_sum"] == [3.0] and r["plain_step"] == [t.tolist() for t in both]
        assert r["plain_keys"] is False  # the fast path publishes nothing
        assert (r["join1"], r["join2"], r["join3"]) == (1, 0, 1), rank
        assert r["old_keys"] == [] and r["round3_keys"] is True and r["final_sum"] == [2.0]
        assert r["watcher_alive"] is False
    _check_round_one(results[1])
    r0 = results[0]
    assert r0["sum2"] == [5.0] and r0["gather2"] == [9]
    assert r0["step2"] == _scaled(r0["mine"][0], 0.5)


def _trio_active(rank: int, out: dict[str, Any], sets: list[Any]) -> None:
    """Ranks 1 and 2 while rank 0 has joined; then rank 2 joins too."""
    import accel.horovod as hvd

    time.sleep(0.3)
    out["sum"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).tolist()
    out["avg"] = hvd.allreduce(torch.tensor([3.0 * rank])).tolist()
    out["gather"] = hvd.allgather(torch.tensor([rank])).tolist()
    out["set12"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum,
                                 process_set=sets[0]).tolist()
    if rank == 1:
        _refused(out, "set01", lambda: hvd.allreduce(torch.ones(1), process_set=sets[1]))
    added = hvd.add_process_set([0, 2])  # rank 0 creates the group from its join too
    if rank == 2:
        _refused(out, "set02", lambda: hvd.allreduce(torch.ones(1), process_set=added))
        out["join"] = hvd.join()
        return
    time.sleep(0.3)  # rank 2 has joined by now (either way the results are the same)
    out["alone_sum"] = hvd.allreduce(torch.tensor([5.0]), op=hvd.Sum).tolist()
    out["alone_avg"] = hvd.allreduce(torch.tensor([6.0])).tolist()
    hvd.barrier()
    out["join"] = hvd.join()


def _trio_worker(rank: int) -> dict[str, Any]:
    import accel.horovod as hvd
    from accel.horovod._session import current

    sets = [hvd.ProcessSet([1, 2]), hvd.ProcessSet([0, 1])]
    hvd.init(process_sets=sets)
    out: dict[str, Any] = {}
    if rank == 0:
        out["join"] = hvd.join()
    else:
        _trio_active(rank, out, sets)
    added = [s for s in current().process_sets.values() if s.ranks == [0, 2]]
    out["added"] = len(added)
    if rank != 1:  # the set added while rank 0 was joined works on both of its ranks
        out["set02_after"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum,
                                           process_set=added[0]).tolist()
    if rank == 0:
        time.sleep(0.3)
    out["join_again"] = hvd.join()
    hvd.shutdown()
    return out


def test_join_three_processes_two_joined_and_process_sets() -> None:
    results = run_workers(_trio_worker, 3, timeout=120)
    for rank in (1, 2):
        r = results[rank]
        assert r["sum"] == [3.0] and r["avg"] == [3.0]  # (3 + 6) / 3: size() counts rank 0
        assert r["gather"] == [1, 2] and r["set12"] == [3.0]
    assert "rank 0 has called hvd.join() and is in this process set" in results[1]["set01"]
    assert "rank 0 has called hvd.join() and is in this process set" in results[2]["set02"]
    assert results[1]["alone_sum"] == [5.0] and results[1]["alone_avg"] == [2.0]
    assert [r["join"] for r in results] == [1, 1, 1]
    assert [r["added"] for r in results] == [1, 1, 1]
    assert results[0]["set02_after"] == [2.0] and results[2]["set02_after"] == [2.0]
    assert [r["join_again"] for r in results] == [0, 0, 0]
