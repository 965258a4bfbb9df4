"""Per-node process groups: one subgroup for the processes of each machine.

Node-local collectives (SyncBatchNorm's ``"node"`` mode) need the ranks that share a machine.
They are read from the real layout, never assumed contiguous: ``mpirun`` may map ranks round
robin (host A gets ranks 0 and 2, host B ranks 1 and 3), and its launcher variables carry no
node index (accel derives ``node_rank = rank // local_world_size`` there, which is wrong for such
a mapping). Every rank reports its node rank and host name; :func:`node_partition` decides:

- the node ranks, when every node rank lies on one host (torchrun's ``GROUP_RANK``, Slurm's
  node id, or several "nodes" simulated on one machine);
- the host names otherwise (a node rank that spans hosts was derived, not reported).

Example:
    >>> node_partition([(0, "a"), (0, "b"), (1, "a"), (1, "b")])  # mpirun, round robin
    [[0, 2], [1, 3]]
    >>> node_partition([(0, "h"), (1, "h"), (0, "h"), (1, "h")])  # 2 nodes simulated on one host
    [[0, 2], [1, 3]]
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from .context import ProcessContext
from .group import new_subgroup

__all__ = ["node_group", "node_partition"]


def node_partition(layout: Sequence[tuple[int, str]]) -> list[list[int]]:
    """The ranks of each node, from every rank's ``(node_rank, hostname)`` (index = rank).

    Nodes are ordered by their lowest rank; ranks inside a node are sorted.
    """
    hosts_of: dict[int, set[str]] = {}
    for node_rank, host in layout:
        hosts_of.setdefault(node_rank, set()).add(host)
    by_node_rank = all(len(hosts) == 1 for hosts in hosts_of.values())
    groups: dict[Any, list[int]] = {}
    for rank, (node_rank, host) in enumerate(layout):
        groups.setdefault(node_rank if by_node_rank else host, []).append(rank)
    return sorted(groups.values(), key=lambda ranks: ranks[0])


def node_group(ctx: ProcessContext) -> Any:
    """This rank's node group (``None``: the default group, when the job has a single node).

    Collective: every rank calls it at the same point (it gathers the layout and creates every
    node's group, in the same order on all ranks). It creates new groups on each call, so its
    caller keeps the result: an ``Accelerator``'s runtime, or the Horovod session's ``extras``.

    Raises:
        RuntimeError: no process group is running although ``ctx`` has several processes.
    """
    if not ctx.is_distributed:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("node process groups need the running process group; create them "
                           "after Accelerator() or hvd.init() started it")
    layout: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(layout, (ctx.node_rank, socket.gethostname()))
    nodes = node_partition([(int(n), str(h)) for n, h in layout])
    if len(nodes) == 1:
        return None
    mine: Any = None
    for ranks in nodes:  # every rank creates every node's group, in the same order
        group = new_subgroup(ranks)
        if ctx.rank in ranks:
            mine = group
    return mine
