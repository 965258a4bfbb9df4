"""Coordination that must not trip the collective timeout, and input splitting.

``leader_first`` lets the main (or local main) process run a block before the others. The others
wait on the c10d store by polling, not in a collective, so a long download on the main process
does not hit the process-group timeout of the waiting ranks.

Example:
    >>> import torch
    >>> from accel.distributed.context import ProcessContext
    >>> ctx = ProcessContext(rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0,
    ...                      device=torch.device("cpu"), backend="gloo", launcher="none")
    >>> split_for_rank(ctx, inputs=[1, 2, 3], apply_padding=True)
    [3, 3]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .context import ProcessContext
from .ops import Communicator

__all__ = ["any_rank", "leader_first", "split_for_rank", "wait_for_key"]


def wait_for_key(store: dist.Store, *, key: str, poll: float = 0.01, max_poll: float = 0.2) -> None:
    """Wait (without a deadline) until ``key`` exists in ``store``."""
    while not store.check([key]):
        time.sleep(poll)
        poll = min(poll * 1.5, max_poll)


def _wait_for_count(store: dist.Store, key: str, count: int) -> None:
    poll = 0.01
    while store.add(key, 0) < count:
        time.sleep(poll)
        poll = min(poll * 1.5, 0.2)


@contextlib.contextmanager
def leader_first(ctx: ProcessContext, *, store: dist.Store | None,
                 local: bool = False) -> Iterator[None]:
    """Run the block on the leader first, then on the other ranks.

    The leader (rank 0, or local rank 0 of each node with ``local=True``) leaves only after every
    member finished the block, as Accelerate's ``main_process_first`` does. Each block gets the
    next number of a per-rank counter kept in the group's store, so that every object of this
    process that coordinates (each ``Accelerator``, each ``PartialState``) draws from one
    sequence and two of them never reuse a key; ranks agree because each enters the same blocks
    in the same order.
    """
    if not ctx.is_distributed or store is None:
        yield
        return
    block = store.add(f"accel/first/count/rank{ctx.rank}", 1)
    leader = ctx.local_rank == 0 if local else ctx.rank == 0
    scope = f"s{block}/node{ctx.node_rank}" if local else f"s{block}/all"
    members = ctx.local_world_size if local else ctx.world_size
    if not leader:
        wait_for_key(store, key=f"accel/first/{scope}/leader")
    yield
    if leader:
        store.set(f"accel/first/{scope}/leader", "1")  # stored as the same bytes as b"1"
        _wait_for_count(store, f"accel/first/{scope}/done", members - 1)
    else:
        store.add(f"accel/first/{scope}/done", 1)


def _slice(n: int, ctx: ProcessContext) -> tuple[int, int]:
    per, extra = divmod(n, ctx.world_size)
    start = ctx.rank * per + min(ctx.rank, extra)
    return start, start + per + (1 if ctx.rank < extra else 0)


def _is_selectable(inputs: Any) -> bool:
    """A table of rows with ``select(indices)`` and ``len()`` (Hugging Face ``datasets``)."""
    return callable(getattr(inputs, "select", None)) and hasattr(inputs, "__len__") \
        and not isinstance(inputs, (list, tuple, torch.Tensor, Mapping))


def split_for_rank(ctx: ProcessContext, *, inputs: Any, apply_padding: bool = False) -> Any:
    """This rank's contiguous share of a list, tuple, tensor, or dict of those.

    Shares differ by at most one item (earlier ranks get the extra ones). With
    ``apply_padding`` every share is padded with the last item to the same length, so that the
    results can be gathered (then drop the padding).
    """
    if isinstance(inputs, Mapping):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(f"split_between_processes got a dict whose values have different "
                             f"lengths {sorted(lengths)}; they must all have the same length")
        # Mapping itself declares no constructor arguments; dict and its subclasses take a dict.
        factory: Callable[[dict[Any, Any]], Any] = type(inputs)
        return factory({k: split_for_rank(ctx, inputs=v, apply_padding=apply_padding)
                        for k, v in inputs.items()})
    if _is_selectable(inputs):  # a Hugging Face datasets.Dataset: select rows, no copy
        n = len(inputs)
        start, end = _slice(n, ctx)
        rows = list(range(start, end))
        if apply_padding and n:
            rows += [n - 1] * (-(-n // ctx.world_size) - len(rows))
        return inputs.select(rows)
    if not isinstance(inputs, (list, tuple, torch.Tensor)):
        raise TypeError(f"split_between_processes needs a list, tuple, tensor, a dict of those "
                        f"or a datasets.Dataset, got {type(inputs).__name__}")
    n = len(inputs)
    start, end = _slice(n, ctx)
    part = inputs[start:end]
    if not apply_padding or n == 0:
        return part
    target = -(-n // ctx.world_size)
    missing = target - (end - start)
    if missing <= 0:
        return part
    # Pad with the last item, in the input's own type (one branch per type, for the checker).
    if isinstance(inputs, torch.Tensor):
        return torch.cat([inputs[start:end], inputs[-1:].expand(missing, *inputs.shape[1:])])
    if isinstance(inputs, list):
        return inputs[start:end] + type(inputs)(list(inputs[-1:]) * missing)
    return inputs[start:end] + type(inputs)(list(inputs[-1:]) * missing)


def any_rank(comm: Communicator, *, flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (one small all-reduce)."""
    value = torch.tensor([1.0 if flag else 0.0], device=comm.ctx.device)
    return bool(comm.reduce(value, "max")[0] > 0)
