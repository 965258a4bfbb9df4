"""``hvd.SyncBatchNorm``: BatchNorm whose batch statistics are those of all processes.

Horovod's class (same arguments and defaults), built on ``torch.nn.SyncBatchNorm`` semantics
through accel's :class:`~accel.distributed.batchnorm.SyncBatchNorm`, which also trains on CPU
(Horovod's and torch's refuse CPU tensors). Two additions, both keyword arguments:

- ``process_set``: average over the ranks of a registered :class:`~accel.horovod.ProcessSet`
  (default: every process);
- ``mode="node"`` (alias ``"local"``, the name of the node-local mode in vendor Horovod
  builds): average over the processes of this machine. The node groups are created once per
  ``hvd.init()`` session (collectively, at the first training forward of such a layer) and
  kept in the session.

In eval mode the running statistics are used; at world size 1 it is a plain BatchNorm. While a
rank of the layer's group has called ``hvd.join()``, a training forward raises
``HorovodInternalError`` (a joined rank can not contribute statistics; Horovod refuses its
allgather too).

Example:
    >>> import torch
    >>> import accel.horovod as hvd
    >>> hvd.init()
    >>> bn = hvd.SyncBatchNorm(3)
    >>> bn(torch.randn(4, 3, 5)).shape
    torch.Size([4, 3, 5])
    >>> hvd.shutdown()
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..distributed.batchnorm import SyncBatchNorm as _AnyDeviceSyncBatchNorm
from ..distributed.batchnorm import parse_mode
from ..distributed.nodes import node_group
from ._join_state import refuse_untracked
from ._session import Session, current
from .process_sets import ProcessSet, group_of

__all__ = ["SyncBatchNorm"]

#: the session's ``extras`` key of this rank's node group
_NODE_GROUP = "sync_batch_norm.node_group"


class SyncBatchNorm(_AnyDeviceSyncBatchNorm):
    """Applies BatchNorm over N-D inputs with statistics averaged across processes.

    Args:
        num_features: number of channels ``C`` of an input of shape ``(N, C, ...)``.
        eps: added to the variance for numerical stability.
        momentum: factor of the running statistics' update (None: cumulative average).
        affine: learn a per-channel scale and shift.
        track_running_stats: keep running statistics (used in eval mode).
        process_set: average over this registered process set only (accel addition).
        mode: ``"global"`` (default: every process, or ``process_set``) or ``"node"`` (the
            processes of this machine; ``"local"`` is accepted as in vendor builds).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *,
                 process_set: ProcessSet | None = None, mode: str = "global") -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        chosen = parse_mode(mode, "hvd.SyncBatchNorm(mode=...)")
        if chosen is None:
            raise ValueError(f"hvd.SyncBatchNorm(mode={mode!r}): use 'global' or 'node'; for "
                             "a BatchNorm that is not synchronised use torch.nn.BatchNorm*d")
        if chosen == "node" and process_set is not None:
            raise ValueError("hvd.SyncBatchNorm: pass either process_set or mode='node' (the "
                             "processes of this machine), not both")
        self.mode = chosen
        self.process_set = process_set
        #: the session whose group is in ``process_group`` (weak: a copy of the model must not
        #: copy the session)
        self._resolved: weakref.ref[Session] | None = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.training:
            self._resolve_group()
            if self._group_size() > 1:
                refuse_untracked(current(), group=self.process_group, what="SyncBatchNorm")
        return super().forward(input)

    def _resolve_group(self) -> None:
        """Point ``process_group`` at the group of this layer's set or node (once per session)."""
        session = current()
        if self._resolved is not None and self._resolved() is session:
            return
        group: Any = None
        if self.mode == "node":
            if _NODE_GROUP not in session.extras:
                session.extras[_NODE_GROUP] = node_group(session.context)
            group = session.extras[_NODE_GROUP]
        elif self.process_set is not None:
            group = group_of(self.process_set)
        self.process_group, self._resolved = group, weakref.ref(session)
