"""hvd.DistributedOptimizer against single-process references, with real processes over gloo.

Every distributed case trains a small model for a few steps on 2 ranks (each on its shard of a
global batch) and compares the parameters with one process that minimises the loss Horovod's
reduction implies: the average (``op=Average``) or the sum (``op=Sum``) over ranks of each rank's
loss, summed over the ``backward_passes_per_step`` micro-batches (Horovod does not divide by
them). One spawn runs all the cases (each spawn costs seconds).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.spawn import run_workers

WORLD = 2
STEPS = 3
LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, int], torch.Tensor]


def _model(layers: int = 2, width: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, 1))


def _batch(step: int, width: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, width, generator=gen), torch.randn(8, 1, generator=gen)


def _mse(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def _micro(x: torch.Tensor, y: torch.Tensor, rank: int, passes: int) -> list[tuple[Any, Any]]:
    xs, ys = x.chunk(WORLD)[rank], y.chunk(WORLD)[rank]
    return list(zip(xs.chunk(passes), ys.chunk(passes), strict=True))


def _train(rank: int, make: Callable[[], torch.nn.Module], loss_fn: LossFn = _mse,
           passes: int = 1, clip: float | None = None, **kw: Any) -> torch.nn.Module:
    import accel.horovod as hvd

    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   model.named_parameters(), backward_passes_per_step=passes,
                                   **kw)
    for step in range(STEPS):
        x, y = _batch(step)
        for xm, ym in _micro(x, y, rank, passes):
            loss_fn(model, xm, ym, rank).backward()
        if clip is None:
            opt.step()
        else:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        opt.zero_grad()
    return model


def _reference(make: Callable[[], torch.nn.Module], loss_fn: LossFn = _mse, passes: int = 1,
               clip: float | None = None, average: bool = True) -> torch.nn.Module:
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = _batch(step)
        total = sum(loss_fn(model, xm, ym, r) for r in range(WORLD)
                    for xm, ym in _micro(x, y, r, passes))
        (total / WORLD if average else total).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return model


def _gap(a: torch.nn.Module, b: torch.nn.Module) -> float:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return max((p - q).abs().max().item() for p, q in pairs)


class _Recorder:
    """Wraps dist.all_reduce: counts the calls and keeps what was sent, in order of events."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.sent: list[torch.Tensor] = []
        self.original = dist.all_reduce

        def record(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.events.append("all_reduce")
            self.sent.append(tensor.detach().clone())
            return self.original(tensor, *args, **kwargs)

        dist.all_reduce = record

    def calls(self) -> int:
        return self.events.count("all_reduce")

    def clear(self) -> None:
        self.events.clear()
        self.sent.clear()


def _unused_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                 rank: int) -> torch.Tensor:
    """Rank 0 uses the ``extra`` head, rank 1 does not; ``never`` is used by no rank."""
    out = model.body(x)  # type: ignore[operator]
    if rank == 0:
        out = out + model.extra(x)  # type: ignore[operator]
    return ((out - y) ** 2).mean()


def _unused_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.body, model.extra, model.never = (torch.nn.Linear(8, 1), torch.nn.Linear(8, 1),
                                            torch.nn.Linear(8, 1))
    return model


def _training_cases(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    out["average"] = _gap(_train(rank, _model), _reference(_model))
    out["passes2"] = _gap(_train(rank, _model, passes=2), _reference(_model, passes=2))
    out["fp16"] = _gap(_train(rank, _model, compression=hvd.Compression.fp16),
                       _reference(_model))
    out["predivide"] = _gap(_train(rank, _model, gradient_predivide_factor=4.0),
                            _reference(_model))
    out["sum"] = _gap(_train(rank, _model, op=hvd.Sum), _reference(_model, average=False))
    out["groups2"] = _gap(_train(rank, _model, groups=2), _reference(_model))
    out["clip"] = _gap(_train(rank, _model, clip=0.05), _reference(_model, clip=0.05))
    out["clip_is_active"] = _gap(_reference(_model, clip=0.05), _reference(_model)) > 1e-3
    out["unused"] = _gap(_train(rank, _unused_model, _unused_loss),
                         _reference(_unused_model, _unused_loss))
    process_set = hvd.add_process_set([0, 1])
    out["process_set"] = _gap(_train(rank, _model, process_set=process_set), _reference(_model))
    model = _unused_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    _unused_loss(model, *_batch(0), rank).backward()
    opt.synchronize()
    out["never_used_grad_zero"] = [None if p.grad is None else p.grad.abs().max().item()
                                   for p in model.never.parameters()]  # type: ignore[union-attr]


def _bucket_cases(rank: int, out: dict[str, Any], rec: _Recorder) -> None:
    import accel.horovod as hvd

    # 3 x Linear(16, 16) + Linear(16, 1), buckets closed at >= 2200 bytes (in reverse order):
    # [b3, w3, b2, w2, b1, w1] and [b0, w0] -> 2 buckets for 8 parameters.
    model = _model(layers=3, width=16)
    order: list[str] = rec.events
    for p in model[0].parameters():  # the first layer: its gradients are the last to be ready
        p.register_post_accumulate_grad_hook(lambda _p: order.append("first_layer_grad"))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), bucket_cap_mb=2200 / 2**20)
    x, y = _batch(0, width=16)
    rec.clear()
    ((model(x.chunk(2)[rank]) - y.chunk(2)[rank]) ** 2).mean().backward()
    out["events"] = list(order)
    opt.step()
    out["calls_per_step"] = rec.calls()
    out["params"] = len(list(model.parameters()))
    # backward_passes_per_step=2: nothing is sent after the first pass, everything after the 2nd
    model = _model(layers=3, width=16)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   backward_passes_per_step=2, bucket_cap_mb=2200 / 2**20)
    rec.clear()
    counts = []
    for _ in range(2):
        model(x).sum().backward()
        counts.append(rec.calls())
    opt.step()
    out["passes_calls"] = counts
    # groups=2 and num_groups=2 (deprecated) -> two reductions; listed groups + singletons.
    for key, kw in (("groups2", {"groups": 2}), ("num_groups2", {"num_groups": 2}),
                    ("listed", {"groups": [[model[0].weight, model[0].bias]]})):
        model = _model(layers=3, width=16)
        if key == "listed":
            kw = {"groups": [[model[0].weight, model[0].bias]]}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           model.named_parameters(), **kw)
        out[key + "_deprecation"] = any(w.category is DeprecationWarning for w in caught)
        rec.clear()
        model(x).sum().backward()
        opt.step()
        out[key + "_calls"] = rec.calls()
    # gradient_predivide_factor: what is sent is the local gradient divided by the factor
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   gradient_predivide_factor=4.0)
    rec.clear()
    _mse(model, *_batch(0), rank).backward()
    local = torch.cat([p.grad.reshape(-1) for p in reversed(list(model.parameters()))])
    out["predivide_sent"] = (rec.sent[0] * 4.0 - local).abs().max().item()
    opt.step()


def _error_cases(rank: int, out: dict[str, Any]) -> None:
    import accel.horovod as hvd

    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters())
    _mse(model, *_batch(0), rank).backward()
    try:
        opt.zero_grad()
        out["zero_grad_error"] = None
    except AssertionError as exc:
        out["zero_grad_error"] = str(exc)
    opt.step()
    opt.zero_grad()  # fine once the step is done
    _mse(model, *_batch(0), rank).backward()
    try:
        _mse(model, *_batch(1), rank).backward()  # a second pass with backward_passes_per_step=1
        out["too_many_passes"] = None
    except AssertionError as exc:
        out["too_many_passes"] = str(exc)
    # an optimizer that is dropped stops reducing: a new one on the same model just works
    del opt
    gc.collect()
    model.zero_grad()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(2):
        _mse(model, *_batch(step), rank).backward()
        opt.step()
        opt.zero_grad()
    out["rewrapped"] = True
    # synchronize() then step() without skip_synchronize: Horovod's warning; no second reduction
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Sum)
    _mse(model, *_batch(0), rank).backward()
    opt.synchronize()
    reduced = [p.grad.clone() for p in model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()
    out["step_after_sync_warns"] = any("skip_synchronize" in str(w.message) for w in caught)
    out["not_reduced_twice"] = all(torch.equal(a, p.grad) for a, p in
                                   zip(reduced, model.parameters(), strict=True))
    # sparse gradients: refused with the fix, or reduced dense with sparse_as_dense=True
    for dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                       sparse_as_dense=dense)
        try:
            emb(torch.tensor([rank, 5])).sum().backward()
            opt.step()
            out[f"sparse_{dense}"] = emb.weight.grad.to_dense().tolist()
        except ValueError as exc:
            out[f"sparse_{dense}"] = str(exc)


def _worker(rank: int) -> dict[str, Any]:
    import accel.horovod as hvd

    hvd.init()
    out: dict[str, Any] = {"size": hvd.size()}
    rec = _Recorder()
    try:
        _training_cases(rank, out)
        _bucket_cases(rank, out, rec)
        _error_cases(rank, out)
    finally:
        dist.all_reduce = rec.original
        hvd.shutdown()
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_workers(_worker, WORLD, timeout=240)


def test_training_matches_single_process_reference(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["size"] == WORLD
        for case in ("average", "passes2", "predivide", "sum", "groups2", "clip", "unused",
                     "process_set"):
            assert out[case] <= 1e-6, (case, out[case])
        assert out["fp16"] <= 2e-3  # half-precision wire: close, not exact
        assert out["clip_is_active"]  # the clipping case really clips
        # a parameter no rank used gets a zero gradient (Horovod fills missing ones with zeros)
        assert out["never_used_grad_zero"] == [0.0, 0.0]


def test_reductions_are_bucketed_and_start_during_backward(
        results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["calls_per_step"] == 2 < out["params"] == 8
        events = out["events"]
        # the first bucket was sent before the first layer's gradients existed, and both
        # buckets were sent by the end of backward (none left for step())
        assert events.index("all_reduce") < events.index("first_layer_grad")
        assert events.count("all_reduce") == 2
        assert out["passes_calls"] == [0, 2]
        assert out["groups2_calls"] == out["num_groups2_calls"] == 2
        assert out["num_groups2_deprecation"] and not out["groups2_deprecation"]
        assert out["listed_calls"] == 1 + 6  # the listed group, then one per other parameter
        assert out["predivide_sent"] <= 1e-6


def test_errors_and_synchronize_flow(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        assert "zero_grad() was called after loss.backward()" in out["zero_grad_error"]
        assert "backward_passes_per_step" in out["too_many_passes"]
        assert out["rewrapped"]
        assert out["step_after_sync_warns"] and out["not_reduced_twice"]
        assert "sparse_as_dense=True" in out["sparse_False"]
        expected = [[0.0] * 3 for _ in range(10)]
        for row in (0, 1, 5, 5):  # rank 0 looks up (0, 5), rank 1 (1, 5); averaged
            expected[row] = [v + 0.5 for v in expected[row]]
        assert out["sparse_True"] == expected, rank


# ---- one process: the wrapper itself and the argument checks (Horovod's errors) ----

@pytest.fixture()
def hvd1() -> Any:
    import accel.horovod as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()


def test_wrapper_is_the_optimizers_class_and_keeps_its_state(hvd1: Any) -> None:
    model = torch.nn.Linear(3, 1)
    base = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    base.step()  # momentum buffers exist before wrapping
    opt = hvd1.DistributedOptimizer(base, model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert opt.defaults["lr"] == 0.5 and opt.param_groups[0]["momentum"] == 0.9
    assert opt.state[model.weight]["momentum_buffer"] is base.state[model.weight][
        "momentum_buffer"]
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    seen: list[int] = []
    opt.register_step_post_hook(lambda *_: seen.append(1))
    opt.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    sched.step()
    assert seen == [1]  # the step hooks run once
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    state = opt.state_dict()
    opt.load_state_dict(state)
    assert opt.state_dict()["param_groups"] == state["param_groups"]
    with pytest.raises(ValueError, match="already"):
        hvd1.DistributedOptimizer(opt)


def test_argument_checks(hvd1: Any) -> None:
    model = torch.nn.Linear(3, 1)

    def make(**kw: Any) -> Any:
        return hvd1.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kw)

    with pytest.raises(ValueError, match="must be unique. Found duplicates: a"):
        make(named_parameters=[("a", model.weight), ("a", model.bias)])
    with pytest.raises(ValueError, match="were not named"):
        make(named_parameters=[("w", model.weight)])
    with pytest.raises(ValueError, match="sequence of tuples"):
        make(named_parameters=[["w", model.weight], ["b", model.bias]])
    with pytest.raises(ValueError, match="Adasum"):
        make(op=hvd1.Adasum)
    with pytest.raises(ValueError, match="op != Average"):
        make(op=hvd1.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="must be > 0"):
        make(backward_passes_per_step=0)
    with pytest.raises(ValueError, match="non-negative integer"):
        make(groups="two")
    with pytest.raises(ValueError, match="only appear once"):
        make(groups=[[model.weight], [model.weight]])
    with pytest.raises(ValueError, match="not a Horovod reduction"):
        make(op=42)
    opt = make(named_parameters=model.named_parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()  # one process: a plain step (Horovod registers no hooks there)
    opt.zero_grad()
    hvd1.shutdown()
    with pytest.raises(ValueError, match="hvd.init"):
        make()


def test_bucket_plans() -> None:
    from accel.horovod.buckets import plan_by_groups, plan_by_size

    a, b, c, d = (torch.zeros(4) for _ in range(4))
    wide = torch.zeros(4, dtype=torch.float64)

    def names(plan: list[list[torch.Tensor]]) -> list[list[str]]:
        label = {id(a): "a", id(b): "b", id(c): "c", id(d): "d", id(wide): "wide"}
        return [[label[id(p)] for p in bucket] for bucket in plan]

    # reverse order; a bucket closes once it reaches the cap (DDP's rule); dtypes never mix
    assert names(plan_by_size([a, b, c, d], 32, 32)) == [["d", "c"], ["b", "a"]]
    assert names(plan_by_size([a, b, c, d], 32, 16)) == [["d"], ["c", "b"], ["a"]]
    assert names(plan_by_size([a, wide, c, d], 1 << 20, 1 << 20)) == [["d", "c"], ["wide"],
                                                                       ["a"]]
    # groups=N: N consecutive chunks (Horovod's split_list); listed groups + singletons;
    # buckets ordered by when backward finishes them (the group holding the last parameters
    # first)
    assert names(plan_by_groups([a, b, c, d], 2)) == [["c", "d"], ["a", "b"]]
    assert names(plan_by_groups([a, b, c, d], 3)) == [["d"], ["c"], ["a", "b"]]
    assert names(plan_by_groups([a, b, c, d], [[a, d]])) == [["c"], ["b"], ["a", "d"]]
    assert names(plan_by_groups([a, wide, c], [[a, wide, c]])) == [["a", "c"], ["wide"]]
