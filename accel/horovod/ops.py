"""Horovod's reductions and broadcasts on torch.distributed: ``hvd.allreduce``, ``hvd.broadcast``.

Names, arguments, defaults and results follow ``horovod.torch``. Each call runs on the group of
its ``process_set`` (``hvd.global_process_set`` by default); ``*_async`` variants return a
handle for :func:`~accel.horovod.handles.synchronize` / :func:`~accel.horovod.handles.poll`,
and the trailing-underscore variants work in place.

``op=hvd.Adasum`` is Horovod's adaptive summation (see :mod:`accel.horovod.adasum`).
``op=hvd.Average`` is a sum followed by a division by the set's size (torch's ``AVG`` exists on
nccl only), folded into ``postscale_factor`` as Horovod does: integer tensors are averaged
through float64 and truncated toward zero, like Horovod's. A grouped reduction sends one
flattened buffer per dtype, not one collective per tensor. ``name=`` does not match
collectives across ranks (torch matches them by order, not by name), but as in Horovod an
``*_async`` op may not reuse the name of a pending one of its kind (``ValueError``, see
:func:`~accel.horovod.handles.check_name`).

Example:
    >>> import torch
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> hvd.allreduce(torch.tensor([1.0, 3.0])).tolist()
    [1.0, 3.0]
    >>> hvd.allreduce(torch.tensor([4]), op=hvd.Sum, prescale_factor=0.5).tolist()
    [2]
    >>> t = torch.zeros(2); _ = hvd.broadcast_(t, root_rank=0); t.tolist()
    [0.0, 0.0]
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ._join_state import begin, done
from ._plumbing import Scope, needs_grad, on_wire, resolve_op, scale_, scope_of, torch_op
from .adasum import adasum_reduce
from .compression import Compression, Compressor
from .handles import check_name, submit, synchronize
from .process_sets import ProcessSet, global_process_set
from .reduce_op import Adasum, Average

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "broadcast",
           "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allreduce",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_"]


def _unflatten(tensors: Sequence[torch.Tensor], *, buffers: list[tuple[list[int], torch.Tensor]],
               inplace: bool) -> list[torch.Tensor]:
    """Split each flat result buffer back into the tensors at its indices: copied into them
    (in place, unless the buffer already is the tensor) or as new tensors on their devices."""
    out: list[Any] = [None] * len(tensors)
    for indices, buf in buffers:
        start = 0
        for i in indices:
            target = tensors[i]
            part = buf[start: start + target.numel()].view(target.shape)
            start += target.numel()
            if inplace:
                if part.data_ptr() != target.data_ptr():
                    with torch.no_grad():
                        target.copy_(part)
                out[i] = target
            else:
                out[i] = part.to(target.device, target.dtype)
    return out


# -- allreduce ------------------------------------------------------------------------------
def _reduce_async(tensors: Sequence[torch.Tensor], *, op: int, prescale_factor: float,
                  postscale_factor: float, process_set: ProcessSet, inplace: bool,
                  what: str, single: bool = False, name: str | None = None) -> int:
    """All-reduce ``tensors`` with one collective per dtype; the handle's result is a list
    (the only tensor when ``single``)."""
    scope = scope_of(process_set)
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"hvd.{what} needs tensors, got {type(tensor).__name__}")
    name = check_name("allreduce", name)
    if op == Adasum:
        result = adasum_reduce(tensors, scope=scope, prescale=prescale_factor,
                               postscale=postscale_factor, what=what)
        if inplace:
            with torch.no_grad():
                for target, value in zip(tensors, result, strict=True):
                    target.copy_(value)
            result = list(tensors)
        return submit([], (lambda: result[0]) if single else (lambda: result), name=name)
    post = postscale_factor / scope.size if op == Average else postscale_factor
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    ticket = begin(scope, desc=("allreduce", op, _sizes(tensors, by_dtype)), what=what, op=op)
    works: list[Any] = []
    buffers: list[tuple[list[int], torch.Tensor]] = []
    for indices in by_dtype.values():
        if len(indices) == 1:  # no concatenation: the tensor itself (in place) or one copy
            buf = on_wire(tensors[indices[0]], wire=scope.wire, copy=not inplace,
                          dtype=scope.wire_dtype(tensors[indices[0]].dtype)).view(-1)
        else:
            buf = torch.cat([t.detach().reshape(-1).to(scope.wire, scope.wire_dtype(t.dtype))
                             for t in (tensors[i] for i in indices)])
        scale_(buf, prescale_factor)
        if scope.distributed:
            works.append(dist.all_reduce(buf, op=torch_op(op), group=scope.group,
                                         async_op=True))
        buffers.append((indices, buf))

    def finish() -> list[torch.Tensor]:
        done(scope, ticket)
        for _indices, buf in buffers:
            scale_(buf, post)
        return _unflatten(tensors, buffers=buffers, inplace=inplace)

    return submit(works, (lambda: finish()[0]) if single else finish, name=name)


def _sizes(tensors: Sequence[torch.Tensor],
           by_dtype: dict[torch.dtype, list[int]]) -> tuple[tuple[torch.dtype, int], ...]:
    """(dtype, elements) of each flat buffer a grouped collective sends, in order."""
    return tuple((dtype, sum(tensors[i].numel() for i in indices))
                 for dtype, indices in by_dtype.items())


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` over the set (not modified); returns a handle."""
    op = resolve_op(op, average=average, what="allreduce_async")
    return _reduce_async([tensor], op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set,
                         inplace=False, what="allreduce_async", single=True, name=name)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing ``tensor`` in place; ``synchronize`` returns ``tensor``."""
    op = resolve_op(op, average=average, what="allreduce_async_")
    return _reduce_async([tensor], op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set,
                         inplace=True, what="allreduce_async_", single=True, name=name)


class _Allreduce(torch.autograd.Function):
    """Differentiable allreduce: the gradient is reduced with the same op and factors."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, prescale: float, postscale: float,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (op, prescale, postscale, process_set)
        result: torch.Tensor = synchronize(_reduce_async(
            [tensor], op=op, prescale_factor=prescale, postscale_factor=postscale,
            process_set=process_set, inplace=False, what="allreduce", single=True))
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, process_set = ctx.args
        grad = _Allreduce.apply(  # type: ignore[no-untyped-call]
            grads[0], op, prescale, postscale, process_set)
        return grad, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` over the set (``op`` defaults to ``Average``); returns a new tensor.

    Differentiable: the gradient is reduced the same way. ``compression`` is applied around the
    collective (e.g. ``hvd.Compression.fp16`` sends float tensors as float16).
    """
    op = resolve_op(op, average=average, what="allreduce")
    sent, ctx = compression.compress(tensor)
    if needs_grad(sent):
        result = _Allreduce.apply(  # type: ignore[no-untyped-call]
            sent, op, prescale_factor, postscale_factor, process_set)
    else:  # no graph to record: skip autograd's bookkeeping (a metric average, a buffer)
        result = synchronize(_reduce_async([sent], op=op, prescale_factor=prescale_factor,
                                           postscale_factor=postscale_factor,
                                           process_set=process_set, inplace=False, what="allreduce",
                                           single=True))
    return compression.decompress(result, ctx)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: int | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` in place over the set; returns ``tensor``."""
    result: torch.Tensor = synchronize(allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set))
    return result


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: int | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors (one collective per dtype); returns a handle."""
    op = resolve_op(op, average=average, what="grouped_allreduce_async")
    return _reduce_async(list(tensors), op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set,
                         inplace=False, what="grouped_allreduce_async")


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors in place (one collective per dtype)."""
    op = resolve_op(op, average=average, what="grouped_allreduce_async_")
    return _reduce_async(list(tensors), op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set,
                         inplace=True, what="grouped_allreduce_async_")


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors (one collective per dtype); returns new tensors."""
    op = resolve_op(op, average=average, what="grouped_allreduce")
    packed = [compression.compress(t) for t in tensors]
    handle = _reduce_async([sent for sent, _ in packed], op=op, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, process_set=process_set,
                           inplace=False, what="grouped_allreduce")
    reduced: list[torch.Tensor] = synchronize(handle)
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, packed, strict=True)]


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: int | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors in place; returns them."""
    result: list[torch.Tensor] = synchronize(grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set))
    return result


# -- broadcast ------------------------------------------------------------------------------
def broadcast_tensors_async(tensors: Sequence[torch.Tensor], *, root_rank: int, scope: Scope,
                            inplace: bool, what: str, single: bool = False,
                            name: str | None = None) -> int:
    """Broadcast ``tensors`` from ``root_rank`` with one collective per dtype."""
    root = scope.root(root_rank, what)
    name = check_name("broadcast", name)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    ticket = begin(scope, desc=("broadcast", root, _sizes(tensors, by_dtype)), what=what, root=root)
    works: list[Any] = []
    buffers: list[tuple[list[int], torch.Tensor]] = []
    for indices in by_dtype.values():
        if len(indices) == 1:
            buf = on_wire(tensors[indices[0]], wire=scope.wire, copy=not inplace,
                          dtype=scope.wire_dtype(tensors[indices[0]].dtype)).view(-1)
        else:
            buf = torch.cat([tensors[i].detach().reshape(-1).to(
                scope.wire, scope.wire_dtype(tensors[i].dtype)) for i in indices])
        if scope.distributed:
            works.append(dist.broadcast(buf, src=root, group=scope.group, async_op=True))
        buffers.append((indices, buf))

    def finish() -> list[torch.Tensor]:
        done(scope, ticket)
        return _unflatten(tensors, buffers=buffers, inplace=inplace)

    return submit(works, (lambda: finish()[0]) if single else finish, name=name)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start copying ``root_rank``'s ``tensor`` to every rank of the set (into a new tensor)."""
    return broadcast_tensors_async([tensor], root_rank=root_rank, scope=scope_of(process_set),
                                   inplace=False, what="broadcast_async", single=True, name=name)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start copying ``root_rank``'s ``tensor`` into ``tensor`` on every rank of the set."""
    return broadcast_tensors_async([tensor], root_rank=root_rank, scope=scope_of(process_set),
                                   inplace=True, what="broadcast_async_", single=True, name=name)


def _broadcast_copy(tensor: torch.Tensor, root_rank: int,
                    process_set: ProcessSet) -> torch.Tensor:
    result: torch.Tensor = synchronize(broadcast_tensors_async(
        [tensor], root_rank=root_rank, scope=scope_of(process_set), inplace=False, what="broadcast",
        single=True))
    return result


class _Broadcast(torch.autograd.Function):
    """Differentiable broadcast; the gradient is Horovod's: averaged over the set, kept on the
    root and zero elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.args = (root_rank, process_set)
        return _broadcast_copy(tensor, root_rank, process_set)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        root_rank, process_set = ctx.args
        grad = allreduce(grads[0], op=Average, process_set=process_set)
        if scope_of(process_set).rank != root_rank:
            grad = grad * 0
        return grad, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """``root_rank``'s ``tensor`` (a global rank in the set), as a new tensor on every rank.

    Differentiable as in Horovod (see :class:`_Broadcast`)."""
    if needs_grad(tensor):
        result: torch.Tensor = _Broadcast.apply(  # type: ignore[no-untyped-call]
            tensor, root_rank, process_set)
        return result
    return _broadcast_copy(tensor, root_rank, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s on every rank of the set; returns it."""
    result: torch.Tensor = synchronize(broadcast_async_(tensor, root_rank, name, process_set))
    return result
