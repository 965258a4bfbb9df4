"""Gradient buckets of ``hvd.DistributedOptimizer``: which gradients travel together, and when.

Horovod sends one request per gradient and its background thread fuses the ready ones into one
buffer. On torch.distributed the same effect comes from buckets planned once: consecutive
parameters (in reverse model order, the order backward produces gradients) are packed up to a
byte budget, or grouped as the user's ``groups`` say. While backward runs, a bucket whose
gradients are all ready is flattened into one buffer and sent with one asynchronous
``all_reduce``; ``finish()`` waits for them and writes the results back into ``.grad``.

Buckets start strictly in their planned order (as DDP's do): collectives must be issued in the
same order on every rank, and a rank whose bucket is late (a parameter unused in this step)
holds back the later ones until ``finish()`` fills its missing gradients with zeros.

Example:
    >>> import torch
    >>> from accel.horovod.buckets import plan_by_size, split_list
    >>> params = [torch.zeros(4), torch.zeros(4), torch.zeros(2, dtype=torch.float64)]
    >>> [len(b) for b in plan_by_size(params, cap_bytes=32, first_cap_bytes=32)]
    [1, 2]
    >>> split_list([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ._join_state import NEVER, JoinState, Ticket, refusal
from .compression import Compressor
from .exceptions import HorovodInternalError
from .reduce_op import Average, Max, Min, Product, Sum

__all__ = ["Bucket", "Reducer", "plan_by_groups", "plan_by_size", "split_list"]

T = TypeVar("T")

_TORCH_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
              Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}

TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before "
                   "call to step(). Increase backward_passes_per_step to accumulate gradients "
                   "locally, or call optimizer.step() (or synchronize()) after each backward.")


def split_list(items: Sequence[T], n: int) -> list[list[T]]:
    """``items`` cut into ``n`` consecutive chunks whose lengths differ by at most one."""
    d, r = divmod(len(items), n)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(n)]


def _key(p: torch.Tensor) -> tuple[torch.dtype, torch.device]:
    return p.dtype, p.device


def plan_by_size(params: Sequence[torch.Tensor], cap_bytes: int,
                 first_cap_bytes: int) -> list[list[torch.Tensor]]:
    """Buckets of ``params`` taken in reverse order, of one dtype and device each; as DDP's, a
    bucket closes once it holds ``cap_bytes`` or more (the first one at ``first_cap_bytes``, so
    that communication starts early)."""
    buckets: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    used = 0
    for p in reversed(params):
        if current and _key(p) != _key(current[0]):
            buckets.append(current)
            current, used = [], 0
        current.append(p)
        used += p.numel() * p.element_size()
        if used >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, used = [], 0
    if current:
        buckets.append(current)
    return buckets


def plan_by_groups(params: Sequence[torch.Tensor],
                   groups: int | Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Horovod's explicit grouping: ``groups`` consecutive chunks of ``params``, or the listed
    groups plus one group per parameter not listed. Each group is cut further by dtype/device
    (one buffer has one dtype); buckets are ordered by when backward should finish them."""
    if isinstance(groups, int):
        chosen = [g for g in split_list(params, groups) if g]
    else:
        known = {id(p) for p in params}
        chosen = [[p for p in g if id(p) in known] for g in groups]
        listed = {id(p) for g in chosen for p in g}
        chosen = [g for g in chosen if g] + [[p] for p in params if id(p) not in listed]
    position = {id(p): i for i, p in enumerate(params)}
    chosen.sort(key=lambda g: -min(position[id(p)] for p in g))
    buckets: list[list[torch.Tensor]] = []
    for group in chosen:
        by_key: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p in group:
            by_key.setdefault(_key(p), []).append(p)
        buckets.extend(by_key.values())
    return buckets


@dataclass(kw_only=True, slots=True)
class Bucket:
    """Parameters reduced together; ``ready`` counts those whose gradient is final."""

    params: list[torch.Tensor]
    ready: int = 0
    #: while in flight: (work handle, the buffer sent, the compression context, the join
    #: ticket)
    flight: tuple[Any, torch.Tensor, Any, Ticket | None] | None = None
    #: the flat buffer, kept from step to step (a fresh one each step costs page faults)
    buffer: torch.Tensor | None = None


@dataclass(kw_only=True, slots=True)
class Reducer:
    """The per-step state machine: gradients become ready, buckets start in order, then finish.

    ``op`` is a Horovod op (Average's division and ``gradient_predivide_factor`` are applied
    here as Horovod's pre- and post-scaling); ``group`` is the torch group (None = default).
    """

    buckets: list[Bucket]
    compression: type[Compressor] | Compressor
    op: int
    predivide: float
    group: Any
    group_size: int
    passes: int
    sparse_as_dense: bool
    name_of: Callable[[torch.Tensor], str]
    delay: dict[torch.Tensor, int] = field(default_factory=dict)
    bucket_of: dict[torch.Tensor, Bucket] = field(default_factory=dict)
    next_bucket: int = 0
    #: True once a gradient arrived since the last finish() (Horovod's pending handles)
    touched: bool = False
    #: the session's join bookkeeping (each bucket is one counted collective) and the set's id
    joins: JoinState | None = None
    set_id: int = 0
    refuse: tuple[int, str] = (NEVER, "")

    def __post_init__(self) -> None:
        for bucket in self.buckets:
            for p in bucket.params:
                self.bucket_of[p] = bucket
        self.refuse = refusal(self.set_id, kind="allreduce", op=self.op)
        self.reset(self.passes)

    def reset(self, passes: int) -> None:
        """Forget the step in progress (``load_state_dict``, ``set_backward_passes_per_step``)."""
        self.passes = passes
        self.delay = {p: passes for p in self.bucket_of}
        for bucket in self.buckets:
            if bucket.flight is not None:
                bucket.buffer = None  # an abandoned reduction may still write into it
            bucket.ready, bucket.flight = 0, None
        self.next_bucket, self.touched = 0, False

    def grad_ready(self, p: torch.Tensor) -> None:
        """The hook: ``p.grad`` got one more backward pass."""
        if self.delay[p] <= 0:
            raise AssertionError(TOO_MANY_PASSES)
        self.touched = True
        self.delay[p] -= 1
        if self.delay[p] == 0:
            self.bucket_of[p].ready += 1
            self._start_ready()

    def _start_ready(self) -> None:
        while self.next_bucket < len(self.buckets):
            bucket = self.buckets[self.next_bucket]
            if bucket.ready < len(bucket.params):
                return
            self._start(bucket)
            self.next_bucket += 1

    def _flat_grad(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            # Unused here but maybe not on other ranks: they wait for this rank's share.
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse:
            if not self.sparse_as_dense:
                raise ValueError(
                    f"parameter {self.name_of(p)!r} has a sparse gradient: accel.horovod "
                    "reduces gradients in dense buckets; pass sparse_as_dense=True to "
                    "hvd.DistributedOptimizer (or use a dense embedding)")
            grad = grad.to_dense()
        return grad.reshape(-1)

    def _gather(self, bucket: Bucket) -> torch.Tensor:
        """The bucket's gradients as one flat tensor: a lone gradient is reduced in place (as
        in Horovod), several are copied into the bucket's buffer."""
        parts = [self._flat_grad(p) for p in bucket.params]
        if len(parts) == 1:
            return parts[0]
        numel = sum(part.numel() for part in parts)
        if bucket.buffer is None or bucket.buffer.numel() != numel:
            bucket.buffer = parts[0].new_empty(numel)
        return torch.cat(parts, out=bucket.buffer)

    def _start(self, bucket: Bucket) -> None:
        with torch.no_grad():
            flat = self._gather(bucket)
            if self.op == Average and self.predivide != 1.0:
                flat = flat.mul_(1.0 / self.predivide)
            sent, ctx = self.compression.compress(flat)
            ticket = None if self.joins is None else self.joins.begin(
                self.set_id, desc=("allreduce", self.op, ((sent.dtype, sent.numel()),)),
                what="DistributedOptimizer.step", refuse=self.refuse[0], why=self.refuse[1],
                complete=True)
            work = dist.all_reduce(sent, op=_TORCH_OPS[self.op], group=self.group,
                                   async_op=True)
        bucket.flight = (work, sent, ctx, ticket)

    def finish(self) -> None:
        """Start what backward left (missing gradients as zeros), wait, write the results.

        A bucket refused because a rank has joined (see :mod:`accel.horovod._join_state`)
        raises once every bucket has been waited for, so that the next step starts clean."""
        for bucket in self.buckets[self.next_bucket:]:
            self._start(bucket)
        refused: HorovodInternalError | None = None
        for bucket in self.buckets:
            if bucket.flight is not None:
                try:
                    work, sent, ctx, ticket = bucket.flight
                    self._write_back(bucket, work=work, sent=sent, ctx=ctx, ticket=ticket)
                except HorovodInternalError as exc:
                    refused = refused or exc
                bucket.flight = None
        self.reset(self.passes)
        if refused is not None:
            raise refused

    def _write_back(self, bucket: Bucket, *, work: Any, sent: torch.Tensor, ctx: Any,
                    ticket: Ticket | None) -> None:
        """Wait for the bucket, then copy (and scale, for Average) its slices into ``.grad``."""
        work.wait()
        if ticket is not None and self.joins is not None:
            self.joins.done(ticket)
        scale = self.predivide / self.group_size if self.op == Average else 1.0
        with torch.no_grad():
            out = self.compression.decompress(sent, ctx)
            offset = 0
            for p in bucket.params:
                grad = p.grad
                assert grad is not None
                view = out[offset:offset + p.numel()].view(p.shape)
                offset += p.numel()
                if grad.is_sparse:
                    grad.zero_().add_(view.mul(scale).to_sparse())
                elif view.dtype == grad.dtype and view.device == grad.device:
                    torch.mul(view, scale, out=grad)  # one pass: scale and copy (or in place)
                else:
                    grad.copy_(view).mul_(scale)
