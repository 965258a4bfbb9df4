"""What every ``accel.horovod`` collective needs: its ranks and group, its op, its wire device.

* :func:`scope_of` turns ``process_set=`` into the torch group (through
  :func:`~accel.horovod.process_sets.group_of`), the set's global ranks, and the device the
  backend communicates on (the process's device for nccl, the CPU otherwise).
* :func:`resolve_op` applies Horovod's ``average=`` / ``op=`` rules.
* :func:`scale_` multiplies in place as Horovod's scale buffers do: floating tensors in their
  dtype, integer tensors through float64 and back, truncated toward zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .._base.warn import warn_user
from ._session import Session, current
from .process_sets import ProcessSet, group_of
from .reduce_op import Average, Max, Min, Product, Sum, name_of

__all__ = ["Scope", "barrier_of", "needs_grad", "on_wire", "resolve_op", "scale_", "scope_of",
           "torch_op", "wire_dtype"]

_TORCH_OPS = {Sum: dist.ReduceOp.SUM, Average: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
              Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}
_WARNED_AVERAGE = "horovod.warned_average"
#: dtypes gloo has no kernels for, and the wider dtype that carries them exactly (a sum wraps
#: around the same way once cast back)
_GLOO_CARRIERS = {torch.int16: torch.int32}


def wire_dtype(dtype: torch.dtype, *, backend: str) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels in on ``backend`` (int16 as int32 off nccl)."""
    return dtype if backend == "nccl" else _GLOO_CARRIERS.get(dtype, dtype)


@dataclass(frozen=True, kw_only=True, slots=True)
class Scope:
    """Where one collective runs: the session, the torch group and the set's global ranks."""

    session: Session
    group: Any  # None = the default group
    ranks: tuple[int, ...]
    set_id: int = 0  # the process set's id (0: the global set)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def distributed(self) -> bool:
        """Whether a torch collective is needed (a one-process job or set needs none)."""
        return self.size > 1 and self.session.context.is_distributed

    @property
    def wire(self) -> torch.device:
        ctx = self.session.context
        return ctx.device if ctx.backend == "nccl" else torch.device("cpu")

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return wire_dtype(dtype, backend=self.session.context.backend)

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self.session.context.rank

    def root(self, root_rank: int, what: str) -> int:
        """Check Horovod's ``root_rank`` (a global rank, which must be in the set)."""
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) \
                or root_rank not in self.ranks:
            where = ("ranks 0.." + str(self.session.context.world_size - 1)
                     if self.ranks == tuple(range(self.session.context.world_size))
                     else f"the process set's ranks {list(self.ranks)}")
            raise ValueError(f"hvd.{what}(root_rank={root_rank!r}): the root must be one of "
                             f"{where} (a global rank, as in Horovod)")
        return root_rank


def scope_of(process_set: ProcessSet | None) -> Scope:
    """The scope of a collective over ``process_set`` (raises before ``hvd.init()``, for an
    unregistered set, or on a rank outside the set)."""
    session = current()
    group = group_of(process_set)
    if process_set is None or process_set.process_set_id == 0:
        return Scope(session=session, group=group, ranks=tuple(range(session.context.world_size)))
    return Scope(session=session, group=group, ranks=tuple(process_set.ranks),
                 set_id=process_set.process_set_id or 0)


def resolve_op(op: int | None, *, average: bool | None, what: str) -> int:
    """Horovod's rules: ``op`` wins; ``average=`` alone is the deprecated spelling (warned
    once per session); neither means ``Average``."""
    if op is not None:
        if average is not None:
            raise ValueError(f"hvd.{what}: the op parameter supersedes average; pass only op=")
    elif average is not None:
        extras = current().extras
        if not extras.get(_WARNED_AVERAGE):
            extras[_WARNED_AVERAGE] = True
            warn_user("Parameter `average` has been replaced with `op` and will be removed "
                      "in Horovod v1.0; use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning)
        op = Average if average else Sum
    else:
        op = Average
    name_of(op)  # ValueError listing the valid ops
    return op


def torch_op(op: int) -> Any:
    """The torch.distributed reduction behind a Horovod op (``Average`` = sum, then divide)."""
    return _TORCH_OPS[op]


def scale_(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """Multiply ``tensor`` by ``factor`` in place, as Horovod does for each dtype."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        tensor.mul_(factor)
    else:  # integers: through float64, then truncated toward zero (a C cast)
        tensor.copy_(tensor.to(torch.float64).mul_(factor))
    return tensor


def needs_grad(tensor: torch.Tensor) -> bool:
    """Whether a differentiable collective must record a graph for ``tensor``."""
    return tensor.requires_grad and torch.is_grad_enabled()


def on_wire(tensor: torch.Tensor, *, wire: torch.device, copy: bool,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    """A detached, contiguous tensor on ``wire`` (in ``dtype``, default its own): a new one
    when ``copy``, otherwise the same storage where possible."""
    source = tensor.detach()
    dtype = dtype or source.dtype
    if copy:
        return source.to(wire, dtype, copy=True, memory_format=torch.contiguous_format)
    if source.device != wire or source.dtype != dtype or not source.is_contiguous():
        return source.to(wire, dtype, memory_format=torch.contiguous_format)
    return source


def barrier_of(session: Session, group: Any) -> None:
    """A barrier of ``group`` (None: the whole job, through the session's communicator)."""
    if group is None:
        session.comm.barrier()
    elif session.context.backend == "nccl":
        dist.barrier(group=group, device_ids=[session.context.device.index])
    else:
        dist.barrier(group=group)
