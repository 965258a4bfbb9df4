"""Start and end the session, and where this process sits: ``hvd.init()``, ``hvd.rank()``, ...

Example:
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.is_initialized()
    (0, 1, 0, 1, True)
    >>> hvd.cross_rank(), hvd.cross_size(), hvd.is_homogeneous()
    (0, 1, True)
    >>> hvd.shutdown(); hvd.is_initialized()
    False
"""

from __future__ import annotations

from collections.abc import Sequence

from ..distributed import Communicator
from ..distributed.debug import consistency_check
from ..run.connector import connect_process
from ._join_state import start_joins, stop_joins
from ._session import Session, current, install, installed, uninstall
from .process_sets import ProcessSet, register_initial_sets

__all__ = ["cross_rank", "cross_size", "init", "is_homogeneous", "is_initialized", "local_rank",
           "local_size", "rank", "shutdown", "size"]


def init(comm: Sequence[int] | None = None,
         process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Start (or join) the job's process group, as ``horovod.torch.init``.

    The launcher decides the ranks: ``accel launch``, torchrun, ``mpirun`` or ``srun`` (read by
    accel's launcher detection), or nothing (one process). Calling ``init()`` again is a no-op,
    as in Horovod.

    Args:
        comm: Horovod accepts an MPI communicator or a list of ranks to run on a subset of the
            job. accel runs on the whole job: only ``None`` (or the list of all ranks) is
            accepted; for a subset, create a process set.
        process_sets: process sets to register at start-up (``hvd.ProcessSet([0, 2])``), or
            ``"dynamic"`` (accepted: ``add_process_set`` works without it in accel).
    """
    if installed() is not None:
        return
    setup = connect_process()
    ctx = setup.context
    if comm is not None and list(comm) != list(range(ctx.world_size)):
        raise ValueError(
            f"hvd.init(comm={comm!r}): accel.horovod runs on every process of the job "
            f"(ranks 0..{ctx.world_size - 1}); to work on a subset, pass "
            "process_sets=[hvd.ProcessSet(ranks)] and give process_set= to the collectives")
    hooks = [consistency_check] if setup.settings.debug else []
    session = Session(setup=setup, comm=Communicator(ctx, hooks))
    register_initial_sets(session, process_sets)
    start_joins(session)
    install(session)


def shutdown() -> None:
    """End the session; the process group is destroyed if ``init()`` started it."""
    session = uninstall()
    if session is not None:
        stop_joins(session)  # before the group (and its store) goes
        session.setup.group.close()


def is_initialized() -> bool:
    return installed() is not None


def rank() -> int:
    return current().context.rank


def size() -> int:
    return current().context.world_size


def local_rank() -> int:
    return current().context.local_rank


def local_size() -> int:
    return current().context.local_world_size


def cross_rank() -> int:
    """This machine's index among the machines of the job (Horovod's cross rank)."""
    return current().context.node_rank


def cross_size() -> int:
    """The number of machines of the job."""
    return current().context.num_nodes


def is_homogeneous() -> bool:
    """True when every machine runs the same number of processes (accel's launchers do)."""
    ctx = current().context
    return ctx.world_size == ctx.num_nodes * ctx.local_world_size
