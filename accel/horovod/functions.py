"""Horovod's helpers for starting a job in step: parameters, optimizer state, Python objects.

* ``broadcast_parameters(params, root_rank)`` takes a ``state_dict()`` or a list of
  ``(name, tensor)`` pairs (``model.named_parameters()``; a plain list of tensors too) and
  overwrites every rank's tensors with the root's, one collective per dtype.
* ``broadcast_optimizer_state(optimizer, root_rank)`` makes every rank's optimizer equal to the
  root's: hyperparameters (``lr``, ``betas``, ... in ``param_groups``), scalars and tensors in
  ``state``. Horovod creates missing state with a dummy zero-gradient step (which can move the
  parameters through weight decay and starts Adam's step count at 1); accel sends the root's
  state layout instead, so no step runs and no parameter changes: a root whose state is still
  empty leaves every rank's state empty, exactly as a fresh optimizer.
* ``broadcast_object`` / ``allgather_object`` move picklable objects (pickle through
  torch.distributed's object collectives; Horovod uses cloudpickle, so lambdas and local
  classes need to be importable here).

Example:
    >>> import torch
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(2, 1)
    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    >>> hvd.broadcast_optimizer_state(torch.optim.SGD(model.parameters(), lr=0.1), root_rank=0)
    >>> hvd.broadcast_object({"epoch": 3}), hvd.allgather_object("a")
    ({'epoch': 3}, ['a'])
    >>> hvd.shutdown()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ._join_state import begin, done
from ._plumbing import scope_of
from .handles import synchronize
from .ops import broadcast_tensors_async
from .process_sets import ProcessSet, global_process_set

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state",
           "broadcast_parameters"]


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``obj`` (any picklable object) on every rank of the set."""
    scope = scope_of(process_set)
    root = scope.root(root_rank, "broadcast_object")
    if not scope.distributed:
        return obj
    box = [obj if scope.rank == root else None]
    ticket = begin(scope, desc=("broadcast_object", root), what="broadcast_object", root=root)
    dist.broadcast_object_list(box, src=root, group=scope.group,
                               device=scope.wire)
    done(scope, ticket)
    return box[0]


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's ``obj`` (picklable), as a list in rank order of the set."""
    scope = scope_of(process_set)
    if not scope.distributed:
        return [obj]
    out: list[Any] = [None] * scope.size
    ticket = begin(scope, desc=("allgather_object",), what="allgather_object")
    dist.all_gather_object(out, obj, group=scope.group)
    done(scope, ticket)
    return out


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite every rank's tensors in ``params`` with ``root_rank``'s, in place.

    ``params``: a ``state_dict()`` (broadcast in sorted key order, as Horovod) or an iterable
    of ``(name, tensor)`` pairs or of tensors (``model.named_parameters()``,
    ``model.parameters()``). Every rank must pass the same names, shapes and dtypes.
    """
    if isinstance(params, Mapping):
        tensors = [t for _, t in sorted(params.items())]
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes, torch.Tensor)):
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
    else:
        raise ValueError(f"hvd.broadcast_parameters: invalid params of type "
                         f"{type(params).__name__}; pass model.state_dict() or "
                         "model.named_parameters()")
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"hvd.broadcast_parameters: {type(tensor).__name__} is not a "
                             "tensor; pass model.state_dict() or model.named_parameters()")
    scope = scope_of(global_process_set)
    synchronize(broadcast_tensors_async(tensors, root_rank=root_rank, scope=scope, inplace=True,
                                        what="broadcast_parameters"))


def _layout(state: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """The state with every tensor replaced by its (shape, dtype): what a rank must allocate."""
    return {pid: {key: (("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor)
                        else ("value", v)) for key, v in entries.items()}
            for pid, entries in state.items()}


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None) -> None:
    """Make every rank's optimizer equal to ``root_rank``'s (hyperparameters and state).

    Works with optimizers whose state is still empty without taking a step (the parameters
    are never touched; see the module docstring), and with any optimizer whose
    ``state_dict()`` round-trips (L-BFGS included). ``model`` is accepted for compatibility.
    """
    scope = scope_of(global_process_set)
    root = scope.root(root_rank, "broadcast_optimizer_state")
    mine = optimizer.state_dict()
    sent = None
    if scope.rank == root:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in mine["param_groups"]]
        sent = {"groups": groups, "layout": _layout(mine["state"])}
    received = broadcast_object(sent, root)
    if received is None:  # one process: nothing to do
        return
    layout: dict[int, dict[str, Any]] = received["layout"]
    tensors: list[torch.Tensor] = []
    state: dict[int, dict[str, Any]] = {}
    for pid in sorted(layout):
        state[pid] = {}
        for key in sorted(layout[pid]):
            kind, *rest = layout[pid][key]
            if kind == "value":
                state[pid][key] = rest[0]
                continue
            tensor = (mine["state"][pid][key].detach().contiguous() if scope.rank == root
                      else torch.empty(rest[0], dtype=rest[1]))
            state[pid][key] = tensor
            tensors.append(tensor)
    synchronize(broadcast_tensors_async(tensors, root_rank=root, scope=scope, inplace=True,
                                        what="broadcast_optimizer_state"))
    if scope.rank == root:
        return
    if len(received["groups"]) != len(mine["param_groups"]):
        raise ValueError(f"hvd.broadcast_optimizer_state: rank {root} has "
                         f"{len(received['groups'])} parameter groups, this rank "
                         f"{len(mine['param_groups'])}; build the optimizer the same way on "
                         "every rank")
    groups = [dict(g, params=own["params"])
              for g, own in zip(received["groups"], mine["param_groups"], strict=True)]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
