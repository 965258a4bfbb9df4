"""``op=hvd.Adasum``: Adaptive Summation (Maleki et al., 2020), as Horovod combines gradients.

Two gradients ``a`` and ``b`` combine as ``(1 - a·b / 2|a|²) a + (1 - a·b / 2|b|²) b``:
orthogonal gradients add up, parallel ones average. Ranks combine pairwise in a binary tree
(rank 0 with 1, 2 with 3, then the pairs' results, ...), which is the order of Horovod's
vector-halving distance-doubling exchange, each tensor on its own (dot products are per tensor,
never across a fused buffer). A coefficient whose squared norm is below ``sqrt(DBL_MIN)``
stays 1, as in Horovod; dot products and norms are taken in float64.

As in Horovod: only float tensors, only the global process set, and a power-of-two number of
ranks; on nccl (GPU) the ranks of each machine are first averaged and Adasum runs across the
machines (their number must be a power of two, each with as many processes).

accel has no point-to-point exchange for this: every rank all-gathers the tensors (one
collective per dtype) and computes the same tree, so memory and traffic grow with the number
of ranks; that is the price of exact, backend-independent results.

Example:
    >>> import torch
    >>> rows = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [2.0, 0.0]])
    >>> adasum_combine(rows[:2]).tolist(), adasum_combine(rows[2:]).tolist()  # sum; average
    ([1.0, 1.0], [2.0, 0.0])
    >>> adasum_combine(rows).tolist()  # then (0+1) with (2+3): 0.5 * [1, 1] + 0.75 * [2, 0]
    [2.0, 0.5]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ._join_state import begin, done
from ._plumbing import Scope, scale_

__all__ = ["adasum_combine", "adasum_reduce"]

_TINY = math.sqrt(sys.float_info.min)  # Horovod's sqrt(DBL_MIN)
#: ``all_gather_single`` replaces the deprecated ``all_gather_into_tensor`` in newer torch
_ALL_GATHER_INTO = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dot = float(torch.dot(a, b))
    a_sq, b_sq = float(torch.dot(a, a)), float(torch.dot(b, b))
    a_coeff = 1.0 - dot / a_sq * 0.5 if a_sq >= _TINY else 1.0
    b_coeff = 1.0 - dot / b_sq * 0.5 if b_sq >= _TINY else 1.0
    combined: torch.Tensor = a * a_coeff + b * b_coeff
    return combined


def adasum_combine(rows: torch.Tensor) -> torch.Tensor:
    """Adasum of the rows of ``rows`` (one flattened gradient per rank, a power of two of
    them), combined pairwise in rank order; computed in float64, returned in ``rows``' dtype."""
    level: list[torch.Tensor] = list(rows.to(torch.float64).unbind(0))
    while len(level) > 1:
        level = [_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0].to(rows.dtype)


def _check(scope: Scope, *, tensors: Sequence[torch.Tensor], groups: int, unit: str,
           what: str) -> None:
    if scope.ranks != tuple(range(scope.session.context.world_size)):
        raise NotImplementedError(f"hvd.{what}(op=hvd.Adasum): Adasum runs on the global "
                                  "process set only (as in Horovod); use op=hvd.Average on a "
                                  "process set")
    if groups & (groups - 1):
        raise NotImplementedError(
            f"hvd.{what}(op=hvd.Adasum): Adasum needs a power-of-two number of "
            f"{unit} (this job has {groups}), as "
            "in Horovod; use op=hvd.Average, or run with 2, 4, 8, ... of them")
    for tensor in tensors:
        if not tensor.dtype.is_floating_point:
            raise ValueError(f"hvd.{what}(op=hvd.Adasum) combines float tensors only, got "
                             f"{tensor.dtype}; use op=hvd.Sum for integer tensors")


def adasum_reduce(tensors: Sequence[torch.Tensor], *, scope: Scope, prescale: float,
                  postscale: float, what: str) -> list[torch.Tensor]:
    """Adasum of each tensor over the job's ranks (new tensors, on each tensor's device)."""
    ctx = scope.session.context
    per_node = ctx.local_world_size if ctx.backend == "nccl" else 1
    if scope.size % per_node:
        raise NotImplementedError(f"hvd.{what}(op=hvd.Adasum) on GPUs needs every machine to "
                                  "run the same number of processes, as in Horovod")
    _check(scope, tensors=tensors, groups=scope.size // per_node,
           unit="machines" if ctx.backend == "nccl" else "ranks", what=what)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(index)
    sizes = tuple((dtype, sum(tensors[i].numel() for i in indices))
                  for dtype, indices in by_dtype.items())
    ticket = begin(scope, desc=("adasum", sizes), what=what)  # joined ranks send zeros: neutral
    for indices in by_dtype.values():
        flat = torch.cat([tensors[i].detach().reshape(-1).to(scope.wire) for i in indices])
        scale_(flat, prescale)
        rows = flat.view(1, -1)
        if scope.distributed:
            gathered = flat.new_empty(scope.size * flat.numel())
            _ALL_GATHER_INTO(gathered, flat, group=scope.group)
            rows = gathered.view(scope.size, -1)
        if per_node > 1:  # Horovod's GPU path: average within each machine first
            rows = rows.view(-1, per_node, rows.shape[1]).to(torch.float64).mean(1).to(
                rows.dtype)
        start = 0
        for i in indices:
            n = tensors[i].numel()
            value = adasum_combine(rows[:, start: start + n])
            out[i] = scale_(value, postscale).view(tensors[i].shape).to(tensors[i].device)
            start += n
    done(scope, ticket)
    return [t for t in out if t is not None]
