"""accel.horovod collectives in one process: results, Horovod's conventions, and the errors."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch

import accel.horovod as hvd


@pytest.fixture
def session() -> Iterator[None]:
    hvd.init()
    try:
        yield
    finally:
        hvd.shutdown()


@pytest.mark.parametrize("call", [
    lambda: hvd.allreduce(torch.ones(1)),
    lambda: hvd.allreduce_async_(torch.ones(1)),
    lambda: hvd.grouped_allreduce([torch.ones(1)]),
    lambda: hvd.allgather(torch.ones(1)),
    lambda: hvd.broadcast(torch.ones(1), 0),
    lambda: hvd.alltoall(torch.ones(1)),
    lambda: hvd.reducescatter(torch.ones(1)),
    lambda: hvd.barrier(),
    lambda: hvd.join(),
    lambda: hvd.broadcast_object(1),
    lambda: hvd.allgather_object(1),
    lambda: hvd.broadcast_parameters({"w": torch.ones(1)}, 0),
    lambda: hvd.broadcast_optimizer_state(torch.optim.SGD([torch.ones(1)], lr=0.1), 0),
    lambda: hvd.synchronize(1),
    lambda: hvd.poll(1),
    lambda: hvd.gloo_enabled(),
    lambda: hvd.mpi_enabled(),
    lambda: hvd.start_timeline("t.json"),
])
def test_needs_init(call: object) -> None:
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"Horovod has not been initialized; use hvd.init\(\)"):
        call()  # type: ignore[operator]


def test_one_process_results(session: None) -> None:
    t = torch.tensor([1.0, -2.0])
    assert hvd.allreduce(t).tolist() == [1.0, -2.0]
    for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
        assert hvd.allreduce(t, op=op).tolist() == [1.0, -2.0]
    assert hvd.allreduce(t, op=hvd.Sum, prescale_factor=3.0, postscale_factor=0.5).tolist() \
        == [1.5, -3.0]
    # integers scale through float64 and truncate toward zero, as Horovod's scale buffers do
    assert hvd.allreduce(torch.tensor([-3, 3]), op=hvd.Sum, prescale_factor=0.5).tolist() \
        == [-1, 1]
    out = hvd.allreduce(t)
    assert out is not t and out.data_ptr() != t.data_ptr()
    assert hvd.allreduce_(t, postscale_factor=2.0) is t and t.tolist() == [2.0, -4.0]
    assert hvd.allgather(torch.tensor(5)).tolist() == [5]
    assert hvd.alltoall(torch.arange(2)).tolist() == [0, 1]
    out2, received = hvd.alltoall(torch.arange(3), splits=torch.tensor([2], dtype=torch.int32))
    assert out2.tolist() == [0, 1] and received.tolist() == [2]  # rows past the splits stay
    assert hvd.reducescatter(torch.ones(3, 2), op=hvd.Sum).shape == (3, 2)
    assert hvd.broadcast_object([1, 2]) == [1, 2] and hvd.allgather_object("x") == ["x"]
    assert hvd.join() == 0 and hvd.barrier() is None


def test_non_contiguous_in_place(session: None) -> None:
    base = torch.arange(6.0).reshape(2, 3)
    column = base[:, 1]  # not contiguous: reduced through a copy, written back
    hvd.allreduce_(column, op=hvd.Sum, prescale_factor=2.0)
    assert base.tolist() == [[0.0, 2.0, 2.0], [3.0, 8.0, 5.0]]
    hvd.broadcast_(column, root_rank=0)
    assert base[:, 1].tolist() == [2.0, 8.0]


def test_op_constants_are_horovods() -> None:
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)


def _reference_adasum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The published rule, written out independently of accel.horovod.adasum."""
    a, b = a.double(), b.double()
    dot = (a * b).sum()
    return (1 - dot / (2 * (a * a).sum())) * a + (1 - dot / (2 * (b * b).sum())) * b


def test_adasum_tree_order_and_rule() -> None:
    from accel.horovod.adasum import adasum_combine

    rows = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    expected = _reference_adasum(_reference_adasum(rows[0], rows[1]),
                                 _reference_adasum(rows[2], rows[3]))
    torch.testing.assert_close(adasum_combine(rows), expected.float())
    ortho = torch.tensor([[3.0, 0.0], [0.0, 4.0]])
    assert adasum_combine(ortho).tolist() == [3.0, 4.0]  # orthogonal: the sum
    same = torch.tensor([[1.5, -2.0], [1.5, -2.0]])
    assert adasum_combine(same).tolist() == [1.5, -2.0]  # parallel: the average
    zero = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    assert adasum_combine(zero).tolist() == [1.0, 2.0]  # a zero gradient keeps coefficient 1


def test_bad_op_and_adasum(session: None) -> None:
    with pytest.raises(ValueError, match="not a Horovod reduction"):
        hvd.allreduce(torch.ones(1), op=42)
    t = torch.tensor([1.0, -2.0])
    assert hvd.allreduce(t, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5).tolist() \
        == [1.0, -2.0]
    x = t.clone()
    assert hvd.allreduce_(x, op=hvd.Adasum, postscale_factor=3.0) is x
    assert x.tolist() == [3.0, -6.0]
    with pytest.raises(ValueError, match="float tensors only"):
        hvd.grouped_allreduce_async([torch.ones(1), torch.ones(1, dtype=torch.int32)],
                                    op=hvd.Adasum)
    with pytest.raises(ValueError, match="only hvd.Average and hvd.Sum"):
        hvd.reducescatter(torch.ones(2), op=hvd.Max)
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.reducescatter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)


def test_average_is_deprecated_and_warned_once(session: None) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hvd.allreduce(torch.tensor([2.0]), average=False).tolist() == [2.0]
        hvd.allreduce_(torch.tensor([2.0]), average=True)
    assert [w.category for w in caught] == [DeprecationWarning]
    assert "use op=hvd.Average or op=hvd.Sum" in str(caught[0].message)


def test_bad_root(session: None) -> None:
    for call in (lambda: hvd.broadcast(torch.ones(1), root_rank=1),
                 lambda: hvd.broadcast_async_(torch.ones(1), root_rank=-1),
                 lambda: hvd.broadcast_object(1, root_rank=3),
                 lambda: hvd.broadcast_parameters([torch.ones(1)], root_rank=1),
                 lambda: hvd.broadcast_optimizer_state(
                     torch.optim.SGD([torch.ones(1, requires_grad=True)], lr=0.1), 2)):
        with pytest.raises(ValueError, match=r"root must be one of ranks 0\.\.0"):
            call()


def test_bad_splits_and_params(session: None) -> None:
    with pytest.raises(ValueError, match="must hold 1 non-negative row counts"):
        hvd.alltoall(torch.arange(2), splits=[3])
    with pytest.raises(ValueError, match="must hold 1"):
        hvd.alltoall(torch.arange(2), splits=[1, 1])
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.alltoall(torch.tensor(1.0))
    with pytest.raises(ValueError, match="Average or hvd.Sum only"):
        hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), None, hvd.Max)
    sparse = hvd.sparse_allreduce_async(torch.eye(2).to_sparse(), None, hvd.Average)()
    assert sparse.is_sparse and sparse.to_dense().tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="invalid params of type int"):
        hvd.broadcast_parameters(3, root_rank=0)
    with pytest.raises(ValueError, match="str is not a tensor"):
        hvd.broadcast_parameters({"a": "b"}, root_rank=0)


def test_handles(session: None) -> None:
    h = hvd.allreduce_async(torch.tensor([1.0]), op=hvd.Sum)
    g = hvd.broadcast_async(torch.tensor([3.0]), root_rank=0)
    assert isinstance(h, int) and h != g
    assert hvd.poll(h) is True
    assert hvd.synchronize(g).tolist() == [3.0] and hvd.synchronize(h).tolist() == [1.0]
    with pytest.raises(ValueError, match="already synchronized"):
        hvd.synchronize(h)
    with pytest.raises(ValueError, match="not a handle"):
        hvd.poll(12345)
    with pytest.raises(ValueError, match="not a handle"):
        hvd.synchronize("h")  # type: ignore[arg-type]
    out, splits = hvd.synchronize(hvd.alltoall_async(torch.arange(2)))
    assert out.tolist() == [0, 1] and splits.dtype == torch.int32
    grouped = hvd.synchronize(hvd.grouped_allgather_async([torch.ones(1), torch.zeros(2)]))
    assert [t.tolist() for t in grouped] == [[1.0], [0.0, 0.0]]


def test_handles_do_not_outlive_the_session() -> None:
    hvd.init()
    h = hvd.allreduce_async(torch.ones(1))
    hvd.shutdown()
    hvd.init()
    try:
        with pytest.raises(ValueError, match="another hvd.init"):
            hvd.synchronize(h)
    finally:
        hvd.shutdown()


def test_compression_round_trip(session: None) -> None:
    x = torch.tensor([1.0 / 3.0, 2.0])
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == torch.float32
    assert y.tolist() == x.half().float().tolist() != x.tolist()
    z = hvd.grouped_allreduce([x, torch.tensor([1])], compression=hvd.Compression.bf16)
    assert [t.dtype for t in z] == [torch.float32, torch.int64]
    rs = hvd.reducescatter(x, compression=hvd.Compression.fp16)
    assert rs.dtype == torch.float32 and rs.tolist() == x.half().float().tolist()


def test_allreduce_is_differentiable(session: None) -> None:
    leaf = torch.tensor([1.0, 2.0], requires_grad=True)
    (hvd.allreduce(leaf, op=hvd.Sum, postscale_factor=3.0) ** 2).sum().backward()
    assert leaf.grad is not None and leaf.grad.tolist() == [18.0, 36.0]


def test_broadcast_optimizer_state_without_a_step(session: None) -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.Adam([p], lr=0.5, weight_decay=1.0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert p.tolist() == [1.0, 1.0] and len(opt.state) == 0 and p.grad is None


def test_capabilities(session: None) -> None:
    assert hvd.mpi_built() is False and hvd.mpi_enabled() is False
    assert hvd.mpi_threads_supported() is False
    assert hvd.gloo_built() is True and hvd.gloo_enabled() is True
    assert hvd.ddl_built() is False and hvd.ccl_built() is False
    assert isinstance(hvd.nccl_built(), int) and not isinstance(hvd.nccl_built(), bool)
    assert hvd.cuda_built() is (torch.version.cuda is not None)
    assert (hvd.nccl_built() > 0) is torch.distributed.is_nccl_available()
    assert isinstance(hvd.rocm_built(), bool)
    with pytest.warns(UserWarning, match="torch.profiler"):
        hvd.start_timeline("timeline.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hvd.start_timeline("timeline.json", mark_cycles=True)  # warned once already
        hvd.stop_timeline()


def test_every_public_name_is_exported() -> None:
    for name in ("allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
                 "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
                 "grouped_allreduce_async_", "allgather", "allgather_async",
                 "grouped_allgather", "grouped_allgather_async", "broadcast", "broadcast_",
                 "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
                 "reducescatter", "reducescatter_async", "grouped_reducescatter",
                 "grouped_reducescatter_async", "synchronize", "poll", "join", "barrier",
                 "broadcast_object", "allgather_object", "broadcast_parameters",
                 "broadcast_optimizer_state", "mpi_built", "mpi_enabled",
                 "mpi_threads_supported", "gloo_built", "gloo_enabled", "nccl_built",
                 "cuda_built", "rocm_built", "ddl_built", "ccl_built", "start_timeline",
                 "stop_timeline", "sparse_allreduce_async"):
        assert name in hvd.__all__ and callable(getattr(hvd, name)), name


def test_gradients_in_one_process(session: None) -> None:
    scalar = torch.tensor(2.0, requires_grad=True)
    (hvd.allgather(scalar) * 3).sum().backward()
    assert scalar.grad is not None and scalar.grad.shape == () and scalar.grad.item() == 3.0
    rows = torch.ones(3, 2, requires_grad=True)
    out, _ = hvd.alltoall(rows, splits=[2])
    (out * 5).sum().backward()  # the row past the splits was not sent: zero gradient
    assert rows.grad is not None and rows.grad.tolist() == [[5.0, 5.0], [5.0, 5.0], [0.0, 0.0]]
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 1.0]
    y = torch.ones(2, requires_grad=True)
    (hvd.reducescatter(y, op=hvd.Sum, prescale_factor=2.0) * 1).sum().backward()
    assert y.grad is not None and y.grad.tolist() == [2.0, 2.0]


def test_duplicate_pending_names_are_refused(session: None) -> None:
    t = torch.ones(2)
    first = hvd.allreduce_async(t, name="dup")
    with pytest.raises(ValueError, match="'allreduce.dup' is already pending"):
        hvd.allreduce_async(t, name="dup")
    with pytest.raises(ValueError, match="already pending"):
        hvd.allreduce_async_(t, name="dup")
    other = hvd.broadcast_async(t, 0, name="dup")  # another kind: its own names
    gathered = hvd.allgather_async(t, name="dup")
    with pytest.raises(ValueError, match="'broadcast.dup'"):
        hvd.broadcast_async_(t, 0, name="dup")
    with pytest.raises(ValueError, match="'allgather.dup'"):
        hvd.allgather_async(t, name="dup")
    for handle in (first, other, gathered):
        hvd.synchronize(handle)
    hvd.synchronize(hvd.allreduce_async(t, name="dup"))  # free again once synchronized
    hvd.synchronize(hvd.allreduce_async(t))  # unnamed ones never clash
    hvd.synchronize(hvd.allreduce_async(t))


def test_int16_travels_as_int32_off_nccl() -> None:
    from accel.horovod._plumbing import on_wire, wire_dtype

    assert wire_dtype(torch.int16, backend="gloo") == torch.int32
    assert wire_dtype(torch.int16, backend="nccl") == torch.int16
    assert wire_dtype(torch.float16, backend="gloo") == torch.float16
    t = torch.tensor([-3, 7], dtype=torch.int16)
    wired = on_wire(t, wire=torch.device("cpu"), copy=False, dtype=torch.int32)
    assert wired.dtype == torch.int32 and wired.tolist() == [-3, 7]
    assert on_wire(t, wire=torch.device("cpu"), copy=False).data_ptr() == t.data_ptr()


def test_int16_collectives_keep_their_dtype(session: None) -> None:
    t = torch.tensor([[1, -2]], dtype=torch.int16)
    for result in (hvd.allreduce(t, op=hvd.Sum), hvd.broadcast(t, 0), hvd.alltoall(t),
                   hvd.reducescatter(t, op=hvd.Sum)):
        assert result.dtype == torch.int16 and result.tolist() == [[1, -2]]
    assert hvd.broadcast_(t.clone(), 0).dtype == torch.int16
