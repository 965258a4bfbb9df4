"""``@hvd.elastic.run``: run a training function so that a restarted job resumes from its commit.

Horovod's elastic runner keeps the surviving processes and rolls them back in memory. Under
torchrun (``accel launch --max_restarts N``, and ``--nnodes min:max`` for machines that come
and go) a lost worker makes the agent restart the whole worker group, so here:

1. on entry, every rank looks for the newest commit of this job (:mod:`.store`); the rank
   holding the newest one reads it, and its state is sent to every rank (``state.sync``);
   after a restart the reset callbacks run (the world size may have changed). A first start
   finds nothing and syncs from rank 0, as Horovod does;
2. the function runs; a failed collective (``HorovodInternalError``, torch's ``DistError``:
   a peer was lost) is re-raised, so that the process exits and the agent restarts the group
   (nothing is retried in-process: the process group cannot be re-formed here);
3. when the function returns on every rank, the job's commits are removed.

``HostsUpdatedInterrupt`` raised by the function resets and re-runs it in-process (Horovod's
behaviour; accel itself never raises it).

Example:
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> @hvd.elastic.run
    ... def train(state):
    ...     for state.epoch in range(state.epoch, 3):
    ...         state.commit()
    ...     return state.epoch
    >>> train(hvd.elastic.ObjectState(epoch=0))
    2
    >>> hvd.shutdown()
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from .._session import Session, current
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .state import State

__all__ = ["run"]

_LOG = logging.getLogger("accel.horovod.elastic")
R = TypeVar("R")


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate ``func(state, *args, **kwargs)``, the elastic part of a training script.

    Collectives must happen inside ``func`` (after the state is synchronised), not before the
    call, as in Horovod.
    """
    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        session = current()
        resume(state, session)
        result = _call(func, state=state, args=args, kwargs=kwargs)
        session.comm.barrier()  # every rank is done with the commits
        state.clear_commits()
        session.comm.barrier()
        if session.context.local_rank == 0:
            state.commit_store().remove_all()
        return result
    return wrapper


def _call(func: Callable[..., R], *, state: State, args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> R:
    while True:
        try:
            return func(state, *args, **kwargs)
        except (HorovodInternalError, dist.DistError) as exc:
            _LOG.error("hvd.elastic: a collective failed (%s: %s), most likely because a peer was "
                       "lost; exiting so that the launcher (accel launch --max_restarts N) "
                       "restarts the workers from the last commit", type(exc).__name__, exc)
            raise
        except HostsUpdatedInterrupt as interrupt:
            state.on_reset()
            if not interrupt.skip_sync:
                state.sync()


def resume(state: State, session: Session) -> int:
    """Bring every rank to the newest commit of this job, or sync from rank 0 (see above).

    Returns the commit number resumed from (-1: none).
    """
    store = state.commit_store()
    found = store.newest()
    numbers: list[int] = session.comm.gather_object(found[0] if found else -1)
    best = max(numbers)
    restarted = session.setup.launch.restart_count > 0
    if best < 0:
        state.sync()
        if restarted:
            state.on_reset()
        return -1
    root = numbers.index(best)
    if found is not None and session.context.rank == root:
        state.read_commit(found[1], best)
        _LOG.warning("hvd.elastic: resuming from commit %d (%s), restart %d of the job",
                     best, found[1], session.setup.launch.restart_count)
    own = store.own_newest()
    if own is not None and own[0] == best:
        state.read_local(own[1])  # this rank's own part of the same commit (sampler indices)
    state.continue_from(best)  # numbering continues on every rank
    if root == 0:
        state.sync()
    else:
        state.sync(root_rank=root)
    state.on_reset()
    return best
