"""The single place that starts (and ends) the torch.distributed process group."""

from __future__ import annotations

import atexit
from collections.abc import Sequence
from datetime import timedelta
from typing import TypedDict

import torch
import torch.distributed as dist

from .._base import optional as _optional
from .._base.warn import warn_user
from ..device import Device
from ..env import LaunchInfo
from .context import ProcessContext
from .health.settle import settle

__all__ = ["DEFAULT_TIMEOUT", "ProcessGroupHandle", "build_context", "destroy_process_group",
           "new_subgroup", "start_process_group"]

DEFAULT_TIMEOUT = timedelta(minutes=30)


def build_context(info: LaunchInfo, device: Device) -> ProcessContext:
    """Combine the launcher's view and the chosen device into a ``ProcessContext``.

    If the user already started a process group (e.g. with ``mp.spawn``), its rank and size win.
    """
    rank, world = info.rank, info.world_size
    local_rank, local_world = info.local_rank, info.local_world_size
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if info.world_size == 1 and world > 1:  # started by the user, no launcher variables
            local_rank, local_world = rank, world
        elif (rank, world) != (info.rank, info.world_size):
            raise RuntimeError(
                f"torch.distributed is already initialised as rank {rank} of {world} but the "
                f"launcher environment says rank {info.rank} of {info.world_size}; start the "
                "process group once, or let accel start it"
            )
    torch_device = device.torch_device(local_rank)
    backend = device.dist_backend
    node_rank = rank // max(local_world, 1) if info.launcher == "none" else info.node_rank
    return ProcessContext(rank=rank, local_rank=local_rank, world_size=world,
                          local_world_size=local_world, node_rank=node_rank, device=torch_device,
                          backend=backend, launcher=info.launcher)


class ProcessGroupHandle:
    """The process group accel started (or adopted). ``close()`` destroys only what it started.

    While a group is active, the interpreter's exit first lets the group's worker threads finish
    with the last collectives (see ``settle``): otherwise a worker dropping a tensor during
    interpreter finalisation aborts a process that had finished its work.
    """

    def __init__(self, owned: bool, backend: str | None, timeout: timedelta) -> None:
        self.owned = owned
        self.backend = backend
        self.timeout = timeout
        if backend is not None:
            atexit.unregister(self._settle_at_exit)  # once per process, however many handles
            atexit.register(self._settle_at_exit)

    @property
    def active(self) -> bool:
        return self.backend is not None and dist.is_initialized()

    def store(self) -> dist.Store | None:
        """The c10d key-value store of the default group, for out-of-band reports."""
        if not self.active:
            return None
        getter = getattr(dist.distributed_c10d, "_get_default_store", None)
        return getter() if getter is not None else None

    @staticmethod
    def _settle_at_exit() -> None:
        if dist.is_available() and dist.is_initialized():
            settle()

    def close(self) -> None:
        if self.owned and dist.is_available() and dist.is_initialized():
            settle()  # the group's destructor joins its workers; let them finish first
            dist.destroy_process_group()
        self.owned = False
        self.backend = None


def start_process_group(
    ctx: ProcessContext,
    *, info: LaunchInfo,
    device: Device,
    timeout: timedelta | None = None,
    backend: str | None = None,
    init_method: str | None = None,
    single: bool = False,
) -> ProcessGroupHandle:
    """Bind the device, then start the process group with an explicit timeout. Idempotent.

    World size 1 starts nothing, unless ``single``: then a one-process group on an in-memory
    store (FSDP on one process needs a device mesh, hence a group). If a group already
    exists it is adopted (and not destroyed on ``close``); a different requested timeout or
    backend is reported.
    """
    timeout = timeout or DEFAULT_TIMEOUT
    device.bind(ctx.device)  # before the group, so nccl picks the right GPU (no-op on CPU)
    if not ctx.is_distributed and not single:
        return ProcessGroupHandle(False, None, timeout)
    if dist.is_initialized():
        existing = dist.get_backend()
        if backend is not None and backend != existing:
            warn_user(f"a process group with backend {existing!r} already exists; the "
                      f"requested backend {backend!r} is not applied")
        return ProcessGroupHandle(False, str(existing), timeout)
    backend = backend or ctx.backend
    if backend == "xla":
        # torch_xla registers the "xla" backend on import and rendezvouses through PJRT.
        _optional.require("torch_xla.distributed.xla_backend", extra="xla")
        init_method = init_method or "xla://"
    if not ctx.is_distributed:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
        return ProcessGroupHandle(True, backend, timeout)
    if init_method is None:
        if info.launcher == "torchrun":
            init_method = "env://"  # connects to the elastic agent's store when it hosts one
        else:
            init_method = f"tcp://{_bracket(info.master_addr)}:{info.master_port}"
    kwargs: _GroupOptions = {}  # only what is set, so torch's defaults stand for the rest
    if backend == "nccl":
        kwargs["device_id"] = ctx.device
    if backend == "xla":
        kwargs["init_method"] = init_method  # PJRT's own rendezvous, no store
    else:
        kwargs["store"] = _group_store(init_method, info=info, rank=ctx.rank,
                                       world_size=ctx.world_size, timeout=timeout)
    dist.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timeout, **kwargs)
    return ProcessGroupHandle(True, backend, timeout)


def destroy_process_group(group: dist.ProcessGroup | None = None) -> None:
    """End ``group``, or the default group whoever started it (``PartialState``'s method).

    A no-op when no group exists. Handles that adopted the default group then find it inactive.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if group is None:
        settle()  # the group's destructor joins its workers; let them finish first
    dist.destroy_process_group(group)


def new_subgroup(ranks: Sequence[int], backend: str | None = None,
                 timeout: timedelta | None = None) -> dist.ProcessGroup | None:
    """A process group of ``ranks`` (sorted, distinct) inside the running default group.

    Collective: every rank of the job must call it with the same ``ranks``, in the same order
    as its other group creations (torch's rule for ``new_group``). Returns the group on every
    rank (torch hands non-members a placeholder that must not be used for collectives).
    ``backend`` (default: the default group's) and ``timeout`` (default: torch's) are passed on,
    e.g. a ``"gloo"`` group of every rank for a background thread's CPU-side exchanges.
    """
    members = sorted(set(int(r) for r in ranks))
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("a process subgroup needs a running process group; start one first "
                           "(Accelerator(), PartialState() or hvd.init())")
    world = dist.get_world_size()
    if not members or members[0] < 0 or members[-1] >= world:
        raise ValueError(f"process group ranks {list(ranks)} must be a non-empty list of ranks "
                         f"in 0..{world - 1}")
    group: dist.ProcessGroup | None = dist.new_group(members, timeout=timeout, backend=backend)
    return group


class _GroupOptions(TypedDict, total=False):
    init_method: str
    store: dist.Store
    device_id: torch.device


def _group_store(init_method: str, *, info: LaunchInfo, rank: int, world_size: int,
                 timeout: timedelta) -> dist.Store:
    """The store of a new default group: the rendezvous's (the agent's own after a torchrun
    restart, see :func:`_attempt_store`), under a key prefix per group this rank started on it.

    torch gives every default group the same keys in its store, so a group started after
    another was destroyed in the same job (an ``Accelerator`` built again after
    ``end_training()``) could read the old group's gloo addresses and fail with "connection
    refused", or hang in gloo's connectFullMesh. The n-th group of every rank gets
    ``accel/g<n>``: every rank starts its groups in the same order, and a store that is new
    (rank 0's, started afresh) counts from 1 again, with no old keys to read.
    """
    base = _attempt_store(info, world_size, timeout) if init_method == "env://" else None
    if base is None:
        base, _rank, _world = next(dist.rendezvous(init_method, rank, world_size,
                                                   timeout=timeout))
    base.set_timeout(timeout)
    number = base.add(f"accel/groups/{rank}", 1)
    return dist.PrefixStore(f"accel/g{number}", base)


def _attempt_store(info: LaunchInfo, world_size: int, timeout: timedelta) -> dist.Store | None:
    """After a torchrun restart, the agent's store with this attempt's own key prefix.

    The static rendezvous (the multi-node default) keeps one agent store across restarts, and
    ``env://`` adds no per-attempt prefix, so a restarted worker could read the dead attempt's
    gloo/nccl addresses and fail with "connection refused" (or see its stall-monitor keys).
    ``None`` (plain ``env://``) for a first attempt or a store hosted by rank 0.
    """
    if not (info.use_agent_store and info.restart_count > 0):
        return None
    client = dist.TCPStore(info.master_addr, info.master_port, world_size, is_master=False,
                           timeout=timeout)
    return dist.PrefixStore(f"accel/attempt_{info.restart_count}", client)


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
