"""Which batch each rank takes, round by round (pure logic, no torch.distributed).

The global order of an epoch is cut into *units* (a batch of indices, a piece of a split batch,
or a collated chunk of an iterable stream). A *round* is ``world`` consecutive units; rank ``r``
takes unit ``r`` of every round, so concatenating the ranks' batches of a round in rank order
gives the single-process order. Only the final round can have fewer units than ranks.

With ``even_batches`` the final round is padded (duplicates marked as not real) so every rank
gets a batch; without it the ranks without a unit stop one batch early, and every rank learns the
set of ranks that still have a batch one call in advance (``Step.announce``) so that they can all
create the subgroup that the last gather runs on while every rank is still iterating.

Example:
    >>> rounds = index_rounds([[0, 1], [2, 3], [4]], world=2, split_size=None)
    >>> [(s.payload, s.real, s.last) for s in rank_steps(rounds, rank=1, world=2, pad=None)]
    [([2, 3], 2, True)]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

__all__ = ["IndexPadder", "Step", "Unit", "index_rounds", "rank_steps"]


# Named tuples, not frozen dataclasses: one of each is made per batch, and a frozen
# dataclass's __init__ costs about a microsecond more (a training step's budget is tight).
class Unit(NamedTuple):
    """One rank's share of a round: a payload (indices or a batch) and its number of samples."""

    payload: Any
    size: int


class Step(NamedTuple):
    """What one rank does at one call of its iterator.

    ``payload`` is ``None`` for a terminal step (no batch; only announcements to act on).
    ``active`` lists the ranks that have a batch in this round when that is not every rank.
    ``announce`` lists rank sets whose subgroup every rank must create now, before yielding.
    """

    payload: Any
    size: int
    real: int
    last: bool
    active: tuple[int, ...] | None = None
    announce: tuple[tuple[int, ...], ...] = ()


class Padder(Protocol):
    """``pad(units, final=...) -> [(unit, real), ...]`` with one entry per rank (even_batches)."""

    def __call__(self, units: list[Unit], *, final: bool) -> list[tuple[Unit, int]]: ...


def index_rounds(batches: Iterable[list[int]], *, world: int, split_size: int | None,
                 record: Callable[[list[int]], None] | None = None) -> Iterator[list[Unit]]:
    """Group a batch sampler's output into rounds of ``world`` units.

    Without ``split_size`` each batch is a unit; with it each batch is cut into ``world``
    contiguous pieces of ``split_size`` samples (empty trailing pieces are left out, so a short
    batch can give a round with fewer units). ``record`` sees each unit of the first round (the
    padding source).
    """
    pending: list[Unit] = []
    first_round = True
    for batch in batches:
        batch = list(batch)  # a batch sampler may reuse its list; rounds are read ahead
        if split_size is None:
            pending.append(Unit(batch, len(batch)))
        else:
            if len(batch) > split_size * world:
                raise ValueError(
                    f"split_batches=True got a batch of {len(batch)} samples from the batch "
                    f"sampler, more than batch_size={split_size * world}; make the batch sampler "
                    "yield at most batch_size samples per batch")
            pieces = [batch[q * split_size:(q + 1) * split_size] for q in range(world)]
            pending.extend(Unit(p, len(p)) for p in pieces if p)
        if len(pending) >= world or (split_size is not None and pending):
            head, pending = pending[:world], pending[world:]
            if first_round and record is not None:
                for unit in head:
                    record(unit.payload)
            first_round = False
            yield head
    if pending:
        if first_round and record is not None:
            for unit in pending:
                record(unit.payload)
        yield pending


class IndexPadder:
    """Pads a round of index units by cycling through the first indices of the epoch.

    With a nominal ``unit_size``, the last unit of a partial or final round is completed to
    ``unit_size`` and every missing rank gets ``unit_size`` indices, taken in rank order from
    the start of the epoch's order. Without one (a batch sampler of varying batch sizes) units
    are left as they are and every missing rank gets a whole batch of the first round, cycling
    from its first. Both are what Accelerate's ``BatchSamplerShard`` does.
    """

    def __init__(self, world: int, unit_size: int | None) -> None:
        self.world = world
        self.unit_size = unit_size
        self.initial: list[int] = []
        self.first_batches: list[list[int]] = []

    def record(self, indices: list[int]) -> None:
        self.initial.extend(indices)
        self.first_batches.append(list(indices))

    def __call__(self, units: list[Unit], final: bool) -> list[tuple[Unit, int]]:
        if len(units) == self.world and not (final and self._short(units[-1])):
            return [(unit, unit.size) for unit in units]
        if self.unit_size is None:
            batches = itertools.cycle(self.first_batches)
            pads = [Unit(b, len(b)) for b in itertools.islice(batches, self.world - len(units))]
            return [(unit, unit.size) for unit in units] + [(pad, 0) for pad in pads]
        size = self.unit_size
        source = itertools.cycle(self.initial)
        slots = [(unit, unit.size) for unit in units[:-1]]
        last = units[-1]
        if self._short(last):
            extra = list(itertools.islice(source, size - last.size))
            slots.append((Unit(list(last.payload) + extra, size), last.size))
        else:
            slots.append((last, last.size))
        for _ in range(self.world - len(units)):
            slots.append((Unit(list(itertools.islice(source, size)), size), 0))
        return slots

    def _short(self, unit: Unit) -> bool:
        return self.unit_size is not None and unit.size < self.unit_size


def rank_steps(rounds: Iterable[list[Unit]], *, rank: int, world: int, pad: Padder | None,
               skip: int = 0) -> Iterator[Step]:
    """Turn rounds into this rank's steps, looking one round ahead.

    ``pad`` is the even_batches padder, or ``None`` for even_batches=False. The first ``skip``
    batches of this rank are not yielded (resume); announcements they carried are kept for the
    next step so that every rank still creates the same subgroups in the same order.
    """
    it = iter(rounds)
    cur = next(it, None)
    pending: list[tuple[int, ...]] = []
    if cur is not None and pad is None and len(cur) < world:
        pending.append(tuple(range(len(cur))))
    index = 0
    while cur is not None:
        nxt = next(it, None)
        if nxt is not None and len(cur) < world and pad is None:
            raise ValueError(
                f"a batch in the middle of the epoch gives only {len(cur)} of {world} ranks a "
                "piece (split_batches with a batch sampler that yields short batches); use "
                "even_batches=True or a batch sampler whose batches all have batch_size samples")
        if nxt is not None and pad is None and len(nxt) < world:
            pending.append(tuple(range(len(nxt))))
        slots = pad(cur, final=nxt is None) if pad is not None else [(u, u.size) for u in cur]
        if rank >= len(slots):  # no batch for this rank in the final round
            break
        unit, real = slots[rank]
        has_next = nxt is not None and (pad is not None or rank < len(nxt))
        if index >= skip:
            active = None if len(slots) == world else tuple(range(len(slots)))
            yield Step(unit.payload, unit.size, real, not has_next, active, tuple(pending))
            pending = []
        index += 1
        cur = nxt
    if pending:
        yield Step(None, 0, 0, True, None, tuple(pending))
