"""Accelerate's ``accelerate.utils.operations``: collectives on torch's default process group.

They work on the group started by an ``Accelerator``, a ``PartialState``, torchrun or the user;
with no group they are the world-size-1 no-ops. With ``ACCEL_DEBUG=1`` (or ``state.debug =
True``) every collective first checks that the ranks called the same operation on tensors of
the same shape and dtype, and raises :class:`DistributedOperationException` naming each rank's
call when they did not.

They run through one :class:`~accel.distributed.Communicator` per process group, so that a
gather whose shapes every rank sent last time takes the communicator's fast path (reused
buffers, one collective). :class:`GroupCommunicators` is the per-process holder of those
communicators (DESIGN.md §3.2's one kind of module-level state): it keys each by its
``torch.distributed`` group object, weakly, so a destroyed group's communicator goes with it,
and it reads the environment (``ACCEL_DEBUG``, the launcher's ranks) once per group.
``PartialState`` views of a multi-process job share the group's communicator, so
``state.debug = True`` reaches these functions too.

Example:
    >>> import torch
    >>> gather(torch.tensor([1, 2])).tolist(), reduce(torch.tensor([3.0]), "sum").tolist()
    ([1, 2], [3.0])
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist

from .. import env
from ..data import send_to_device
from ..device import DEVICE_KINDS
from ..distributed import Communicator, ProcessContext, build_context
from ..distributed.debug import consistency_check
from ..distributed.ops import CollectiveMismatchError

__all__ = ["DistributedOperationException", "broadcast", "broadcast_object_list",
           "copy_tensor_to_devices", "gather", "gather_object", "pad_across_processes",
           "reduce", "send_to_device", "wait_for_everyone"]

#: Accelerate's name for what the ``ACCEL_DEBUG`` check raises.
DistributedOperationException = CollectiveMismatchError


class GroupCommunicators:
    """One :class:`Communicator` per ``torch.distributed`` process group, held by the group.

    Example:
        >>> holder = GroupCommunicators()
        >>> holder.current() is holder.current()  # no process group: one of this process alone
        True
    """

    def __init__(self) -> None:
        self._by_group: weakref.WeakKeyDictionary[Any, Communicator] = \
            weakref.WeakKeyDictionary()
        self._alone: Communicator | None = None

    def current(self, ctx: ProcessContext | None = None) -> Communicator:
        """The communicator of torch's default group, built on first use.

        ``ctx``: the context to build it with (a ``PartialState``'s); by default the one
        derivation that the Accelerator uses too (``build_context``: the group's rank, the
        launcher's local rank). Debug checks follow ``ACCEL_DEBUG`` when it is built, and
        ``state.debug`` afterwards.
        """
        if not (dist.is_available() and dist.is_initialized()):
            if self._alone is None:
                self._alone = Communicator(ProcessContext.single())
            return self._alone
        group = dist.group.WORLD
        comm = self._by_group.get(group)
        if comm is None:
            if ctx is None:
                kind = {"nccl": "cuda", "xla": "xla"}.get(str(dist.get_backend()), "cpu")
                ctx = build_context(env.detect_launch(), DEVICE_KINDS[kind]())
            hooks = [consistency_check] if env.read_settings().debug else []
            comm = self._by_group[group] = Communicator(ctx, hooks)
        return comm


#: This process's communicators (the holder named in the module docstring).
COMMUNICATORS = GroupCommunicators()


def _comm() -> Communicator:
    return COMMUNICATORS.current()


def gather(tensor: Any) -> Any:
    """Concatenate tensors from all ranks along dim 0 (first dims may differ)."""
    return _comm().gather(tensor)


def gather_object(obj: Any) -> list[Any]:
    """Gather picklable objects from all ranks (lists are concatenated)."""
    return _comm().gather_object(obj)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduce tensors; ``reduction`` is sum, mean (Accelerate's default here), max or min."""
    return _comm().reduce(tensor, reduction, scale)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copy ``from_process``'s tensors into every rank's tensors, in place."""
    return _comm().broadcast(tensor, from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replace the list's items on every rank by ``from_process``'s items."""
    return _comm().broadcast_object_list(object_list, from_process)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0,
                         pad_first: bool = False) -> Any:
    """Pad tensors along ``dim`` to the largest size on any rank."""
    return _comm().pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)


def wait_for_everyone() -> None:
    """Barrier: every rank waits here until all have arrived (a no-op without a process group).

    Every rank must reach the call, or the others wait forever.
    """
    _comm().barrier()


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The main process's ``tensor`` on every process's device; the others pass None (they
    need not know its shape or dtype).

    Example:
        >>> copy_tensor_to_devices(torch.tensor([1, 2])).tolist()
        [1, 2]
    """
    comm = _comm()
    ctx = comm.ctx
    if ctx.is_main_process and not isinstance(tensor, torch.Tensor):
        raise TypeError("copy_tensor_to_devices(tensor): the main process must pass a tensor "
                        f"(the others pass None), got {type(tensor).__name__}")
    if not ctx.is_distributed:
        assert tensor is not None
        return tensor.to(ctx.device)
    meta: list[Any] = [(tuple(tensor.shape), tensor.dtype) if tensor is not None
                       and ctx.is_main_process else None]
    comm.broadcast_object_list(meta, 0)
    shape, dtype = meta[0]
    if ctx.is_main_process and tensor is not None:
        out = tensor.to(ctx.device).clone()
    else:
        out = torch.empty(shape, dtype=dtype, device=ctx.device)
    return comm.broadcast(out, 0)  # type: ignore[no-any-return]
