"""Horovod's data-exchanging collectives: ``allgather``, ``alltoall``, ``reducescatter``, and
the synchronisation points ``barrier`` and ``join``.

* ``allgather`` concatenates every rank's tensor along dim 0; first dimensions may differ
  (accel's :class:`~accel.distributed.Communicator` gather: one ``all_gather`` in the steady
  state, on every backend).
* ``sparse_allreduce_async`` gathers the indices and values of sparse tensors (Horovod's
  way); its handle is a function to call, as in Horovod.
* ``allgather_async`` / ``grouped_allgather_async`` finish before they return (an uneven
  gather may need a second round that depends on the first); ``alltoall_async`` exchanges the
  split sizes before it returns and the rows in the background.
* ``alltoall(tensor, splits=None)`` sends ``splits[i]`` rows to the set's i-th rank (equal parts
  without ``splits``) with ``all_to_all_single`` (gloo supports it, uneven splits included, in
  the torch versions accel supports); with ``splits`` it returns ``(output, received_splits)``,
  without them only the output, as Horovod does.
* ``reducescatter`` (``op`` = ``Average`` or ``Sum``, as Horovod) gives rank i of the set the
  i-th block of rows of the reduced tensor; when the rows do not divide evenly the first ranks
  get one more row (Horovod's split). An even split uses ``reduce_scatter_tensor``; an uneven
  one (and the grouped form: one collective per dtype) reduces the whole tensor and keeps the
  rank's rows, which moves more data but is correct on every backend.
* ``join()`` has Horovod's semantics: a rank that has joined takes part in the others'
  allreduces with zeros (``Average`` still divides by ``size()``), allgathers with zero rows
  and broadcasts as a receiver until every rank has joined, and returns the rank that joined
  last; ops that can not take part with zeros raise ``HorovodInternalError`` on the ranks that
  issued them (see :func:`join`, :mod:`accel.horovod._join_state` and
  :mod:`accel.horovod._join`).

Example:
    >>> import torch
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> hvd.allgather(torch.tensor([[1, 2]])).tolist()
    [[1, 2]]
    >>> out, received = hvd.alltoall(torch.arange(3), splits=[3]); out.tolist(), received.tolist()
    ([0, 1, 2], [3])
    >>> hvd.reducescatter(torch.tensor([2.0, 4.0])).tolist()
    [2.0, 4.0]
    >>> hvd.join()
    0
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ._join import join_round
from ._join_state import begin, done
from ._plumbing import Scope, barrier_of, needs_grad, on_wire, scale_, scope_of
from .compression import Compression, Compressor
from .handles import check_name, submit, synchronize
from .ops import allreduce
from .process_sets import ProcessSet, global_process_set
from .reduce_op import Average, Sum, name_of

__all__ = ["allgather", "allgather_async", "alltoall", "alltoall_async", "barrier", "join",
           "grouped_allgather", "grouped_allgather_async", "grouped_reducescatter",
           "grouped_reducescatter_async", "reducescatter", "reducescatter_async",
           "sparse_allreduce_async"]

# -- allgather ------------------------------------------------------------------------------
def _gather(tensors: Sequence[torch.Tensor], process_set: ProcessSet,
            what: str = "allgather") -> list[torch.Tensor]:
    scope = scope_of(process_set)
    # a 0-d tensor is one row, and a joined rank sends zero rows of the same dimensions
    leaves = [t.detach().reshape(1) if t.dim() == 0 else t.detach() for t in tensors]
    if not scope.distributed:
        return [t.clone() for t in leaves]
    ticket = begin(scope, desc=("allgather", tuple((t.dtype, t.shape[1:]) for t in leaves)),
                   what=what)
    wired = [t.to(scope.wire_dtype(t.dtype)) for t in leaves]  # int16 as int32 on gloo
    out: list[torch.Tensor] = scope.session.comm.gather(wired, group=scope.group)
    done(scope, ticket)
    return [o.to(t.dtype) for o, t in zip(out, leaves, strict=True)]


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start gathering ``tensor`` from every rank of the set (dim 0 may differ)."""
    full = check_name("allgather", name)
    result = _gather([tensor], process_set)[0]
    return submit([], lambda: result, name=full)


class _Allgather(torch.autograd.Function):
    """Differentiable allgather; the gradient is Horovod's: the gathered gradient averaged over
    the set, then this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, process_set: ProcessSet) -> torch.Tensor:
        ctx.shape, ctx.process_set = tensor.shape, process_set
        return _gather([tensor], process_set)[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        scope = scope_of(ctx.process_set)
        reduced = allreduce(grads[0], op=Average, process_set=ctx.process_set)
        rows = ctx.shape[0] if len(ctx.shape) else 1
        counts = _gather([torch.tensor([rows])], ctx.process_set)[0].tolist()
        offset = sum(counts[: scope.ranks.index(scope.rank)])
        return reduced.narrow(0, offset, rows).reshape(ctx.shape), None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dim 0, in rank order (dim 0 may differ).

    Differentiable as in Horovod (see :class:`_Allgather`)."""
    if not needs_grad(tensor):
        return _gather([tensor], process_set)[0]
    result: torch.Tensor = _Allgather.apply(tensor, process_set)  # type: ignore[no-untyped-call]
    return result


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start gathering a list of tensors (one collective for the list)."""
    result = _gather(list(tensors), process_set)
    return submit([], lambda: result)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """``allgather`` of each tensor of a list, with one collective for the whole list."""
    return _gather(list(tensors), process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None, op: int,
                           process_set: ProcessSet = global_process_set
                           ) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by gathering every rank's indices and values (Horovod's way:
    ``Sum`` or ``Average``); returns a function that gives the (uncoalesced) result."""
    if op not in (Average, Sum):
        raise ValueError(f"hvd.sparse_allreduce_async(op={name_of(op)}): sparse tensors are "
                         "reduced with hvd.Average or hvd.Sum only")
    scope = scope_of(process_set)
    indices, values = _gather([tensor._indices().t().contiguous(), tensor._values()],
                              process_set, "sparse_allreduce_async")
    if op == Average:
        values = values / scope.size
    result = torch.sparse_coo_tensor(indices.t(), values, tensor.shape, check_invariants=True)
    return lambda: result


# -- alltoall -------------------------------------------------------------------------------
def _splits(tensor: torch.Tensor, splits: Any, scope: Scope) -> list[int]:
    if tensor.dim() == 0:
        raise ValueError("hvd.alltoall needs a tensor with at least one dimension (rows are "
                         "sent along dim 0)")
    rows = tensor.shape[0]
    if splits is None:
        if rows % scope.size:
            raise ValueError(f"hvd.alltoall: without splits, the first dimension ({rows}) must "
                             f"divide evenly among the {scope.size} ranks; pass splits=")
        return [rows // scope.size] * scope.size
    if isinstance(splits, torch.Tensor) and (splits.dtype.is_floating_point
                                             or splits.dtype.is_complex
                                             or splits.dtype == torch.bool):
        raise ValueError(f"hvd.alltoall: splits must hold integers (as Horovod's int32 "
                         f"tensor), got a {splits.dtype} tensor; pass splits.int()")
    values = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(values) != scope.size or min(values) < 0 or sum(values) > rows:
        raise ValueError(f"hvd.alltoall: splits={values} must hold {scope.size} non-negative "
                         f"row counts (one per rank of the set) summing to at most {rows}")
    return values


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)``."""
    scope = scope_of(process_set)
    sent = _splits(tensor, splits, scope)
    split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    source = tensor.detach()[: sum(sent)]
    if not scope.distributed:
        result = (source.clone(), torch.tensor(sent, dtype=split_dtype))
        return submit([], lambda: result)
    ticket = begin(scope, desc=("alltoall", source.dtype, source.shape[1:]), what="alltoall")
    counts = torch.tensor(sent, dtype=torch.int64, device=scope.wire)
    received_t = torch.empty_like(counts)
    dist.all_to_all_single(received_t, counts, group=scope.group)
    received = received_t.tolist()
    wire_in = on_wire(source, wire=scope.wire, copy=False, dtype=scope.wire_dtype(source.dtype))
    out = wire_in.new_empty((sum(received),) + tuple(source.shape[1:]))
    work = dist.all_to_all_single(out, wire_in, output_split_sizes=received,
                                  input_split_sizes=sent, group=scope.group, async_op=True)
    splits_out = torch.tensor(received, dtype=split_dtype)

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        done(scope, ticket)
        return out.to(tensor.device, tensor.dtype), splits_out

    return submit([work], finish)


class _Alltoall(torch.autograd.Function):
    """Differentiable alltoall: the gradient goes back along the same rows (rows past the
    splits, which were not sent, get zero)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any,
                process_set: ProcessSet) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = synchronize(alltoall_async(tensor, splits, None, process_set))
        ctx.received, ctx.shape, ctx.process_set = received, tensor.shape, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        grad, _ = synchronize(alltoall_async(grads[0].contiguous(), ctx.received, None,
                                             ctx.process_set))
        if grad.shape[0] < ctx.shape[0]:
            grad = torch.cat([grad, grad.new_zeros((ctx.shape[0] - grad.shape[0],)
                                                   + tuple(ctx.shape[1:]))])
        return grad, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[i]`` rows of ``tensor`` to the set's i-th rank (equal parts by default).

    Returns the received rows concatenated in rank order and, when ``splits`` is given, also
    the number of rows received from each rank (Horovod's ``(output, received_splits)``).
    Differentiable with respect to ``tensor``.
    """
    if needs_grad(tensor):
        output, received = _Alltoall.apply(  # type: ignore[no-untyped-call]
            tensor, splits, process_set)
    else:
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


# -- reducescatter --------------------------------------------------------------------------
def _rows_of(rows: int, size: int, index: int) -> tuple[int, int]:
    """Horovod's split: the first ``rows % size`` ranks get one extra row."""
    base, extra = divmod(rows, size)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _reducescatter_async(tensors: Sequence[torch.Tensor], *, op: int, process_set: ProcessSet,
                         prescale: float, postscale: float, single: bool) -> int:
    name_of(op)
    if op not in (Average, Sum):
        raise ValueError(f"hvd.reducescatter(op={name_of(op)}): Horovod's reducescatter "
                         "supports only hvd.Average and hvd.Sum; use allreduce for other ops")
    scope = scope_of(process_set)
    for t in tensors:
        if t.dim() == 0:
            raise ValueError("hvd.reducescatter needs tensors with at least one dimension")
    post = postscale / scope.size if op == Average else postscale
    index = scope.ranks.index(scope.rank)
    ticket = begin(scope, desc=("reducescatter", tuple((t.dtype, t.shape) for t in tensors)),
                   what="reducescatter")
    works: list[Any] = []
    parts: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = []  # (buf, out, src)
    for tensor in tensors:
        buf = scale_(on_wire(tensor, wire=scope.wire, copy=True,
                             dtype=scope.wire_dtype(tensor.dtype)), prescale)
        rows = tensor.shape[0]
        if scope.distributed and rows % scope.size == 0:
            out = buf.new_empty((rows // scope.size,) + tuple(tensor.shape[1:]))
            works.append(dist.reduce_scatter_tensor(out.view(-1), buf.view(-1),
                                                    group=scope.group, async_op=True))
            parts.append((buf, out, tensor))
            continue
        if scope.distributed:
            works.append(dist.all_reduce(buf, group=scope.group, async_op=True))
        parts.append((buf, None, tensor))

    def finish() -> Any:
        done(scope, ticket)
        results = []
        for buf, out, tensor in parts:
            if out is None:
                start, end = _rows_of(tensor.shape[0], scope.size, index)
                out = buf[start:end].clone()
            results.append(scale_(out, post).to(tensor.device, tensor.dtype))
        return results[0] if single else results

    return submit(works, finish)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of ``tensor`` (not modified); returns a handle."""
    return _reducescatter_async([tensor], op=op, process_set=process_set, prescale=prescale_factor,
                                postscale=postscale_factor,
                                single=True)


class _Reducescatter(torch.autograd.Function):
    """Differentiable reducescatter; the gradient is Horovod's: this rank's gradient, scaled
    (by the set's size for ``Sum``, by the pre- and postscale factors), all-gathered."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, process_set: ProcessSet,
                prescale: float, postscale: float) -> torch.Tensor:
        ctx.args = (op, process_set, prescale * postscale)
        result: torch.Tensor = synchronize(_reducescatter_async(
            [tensor], op=op, process_set=process_set, prescale=prescale, postscale=postscale,
            single=True))
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, process_set, factor = ctx.args
        if op == Sum:
            factor *= scope_of(process_set).size
        grad = grads[0] * factor if factor != 1.0 else grads[0]
        return _gather([grad], process_set)[0], None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none, op: int = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the set and return this rank's block of rows (differentiable
    as in Horovod, see :class:`_Reducescatter`)."""
    sent, ctx = compression.compress(tensor)
    if needs_grad(sent):
        out = _Reducescatter.apply(  # type: ignore[no-untyped-call]
            sent, op, process_set, prescale_factor, postscale_factor)
    else:
        out = synchronize(_reducescatter_async([sent], op=op, process_set=process_set,
                                               prescale=prescale_factor,
                                               postscale=postscale_factor, single=True))
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                                op: int = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of each tensor of a list; returns a handle."""
    return _reducescatter_async(list(tensors), op=op, process_set=process_set,
                                prescale=prescale_factor,
                                postscale=postscale_factor, single=False)


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """``reducescatter`` of each tensor of a list; returns this rank's blocks."""
    packed = [compression.compress(t) for t in tensors]
    outs = synchronize(_reducescatter_async([s for s, _ in packed], op=op, process_set=process_set,
                                            prescale=prescale_factor, postscale=postscale_factor,
                                            single=False))
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, packed, strict=True)]


# -- barrier and join -----------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the set reaches this call."""
    scope = scope_of(process_set)
    if not scope.distributed:
        return
    ticket = begin(scope, desc=("barrier",), what="barrier")
    barrier_of(scope.session, scope.group)
    done(scope, ticket)


def join(device: int = -1) -> int:
    """Wait until every rank has called ``join``; returns the rank that joined last.

    As in Horovod, a rank that has joined (typically: it ran out of data) keeps taking part in
    the collectives the other ranks still issue on the global process set, until they have all
    joined: in ``allreduce`` (every form: in place, async, grouped, and the gradient buckets of
    ``hvd.DistributedOptimizer``) it contributes zeros, so ``Sum`` adds the others' tensors and
    ``Average`` divides their sum by ``size()``, joined ranks included; ``Adasum`` and
    ``barrier`` work too. Beyond Horovod (which refuses them while a rank has joined), in
    ``allgather`` it contributes zero rows and in ``broadcast`` (and ``broadcast_object``) it
    receives. Collectives that can not take part with zeros raise
    :class:`~accel.horovod.HorovodInternalError` on the ranks that issued them, naming the
    joined rank, and the job goes on: ``Min``/``Max``/``Product`` reductions (an in-place one
    holds the other ranks' result), ``alltoall``, ``reducescatter``, ``allgather_object``, a
    broadcast whose root has joined, and the collectives of a process set that contains a
    joined rank, but for broadcasts from a rank that has not joined (``join`` joins the global
    set, as in Horovod). Every rank of the job calls ``join`` once per round; the next round
    (e.g. the next epoch) starts when it returns, on every rank.

    Only the collectives of ``accel.horovod`` take part: a ``torch.distributed`` call of your
    own, or ``hvd.SyncBatchNorm``'s statistics (which raise while a rank of their group has
    joined), can not be answered by a joined rank. It costs nothing while no rank has joined:
    the ranks learn of a join through the job's key-value store (see
    :mod:`accel.horovod._join_state`). ``device`` is accepted for compatibility.

    Example:
        >>> import accel.horovod as hvd
        >>> hvd.init()
        >>> hvd.join()  # one process: it joins last
        0
        >>> hvd.shutdown()
    """
    scope = scope_of(global_process_set)
    if not scope.distributed:
        return scope.rank
    return join_round(scope)
