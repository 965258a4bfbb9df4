"""accel.data in one process: the shard plan against a brute-force reference (ranks simulated),
seeded shuffling, exact resume, device transfer, trimming, skipping and tracking."""

from __future__ import annotations

import itertools
import json
import random
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from accel.config import DataLoaderConfiguration
from accel.data import (DataTracker, PreparedDataLoader, SeedableSampler, prepare_data_loader,
                        send_to_device, skip_first_batches, trim_batch)
from accel.data.loader import _select_source
from accel.data.sources import IterableSource, MapSource
from accel.distributed import Communicator, ProcessContext

Pair = namedtuple("Pair", ["pred", "label"])


class Stream(IterableDataset):
    """0..n-1 as a stream (with a length, so len() of the loader is defined)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list[int] = []

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def _ctx(rank: int = 0, world: int = 1) -> ProcessContext:
    return ProcessContext(rank, rank, world, world, 0, torch.device("cpu"), "gloo", "none")


def _prepared(loader: DataLoader, rank: int = 0, world: int = 1, seed: int = 0,
              **config: Any) -> PreparedDataLoader:
    cfg = DataLoaderConfiguration(**config)
    ctx = _ctx(rank, world)
    source = _select_source(loader, ctx, cfg, seed)
    return PreparedDataLoader(loader, source, ctx=ctx, device=torch.device("cpu"), config=cfg,
                              tracker=DataTracker(), seed=seed)


# -- brute-force reference of the map-style plan ----------------------------------------------
def _reference(n: int, bs: int, world: int, drop_last: bool, even: bool,
               split: bool) -> list[list[tuple[list[int], int]]]:
    """Every rank's (indices, real) batches, materialised the obvious way."""
    batches = [list(range(i, min(i + bs, n))) for i in range(0, n, bs)]
    if drop_last and batches and len(batches[-1]) < bs:
        batches.pop()
    if split:
        unit = bs // world
        rounds = [[b[q * unit:(q + 1) * unit] for q in range(world) if b[q * unit:(q + 1) * unit]]
                  for b in batches]
    else:
        unit = bs
        rounds = [batches[i:i + world] for i in range(0, len(batches), world)]
    initial = [x for part in rounds[0] for x in part] if rounds else []
    ranks: list[list[tuple[list[int], int]]] = [[] for _ in range(world)]
    for k, rnd in enumerate(rounds):
        final = k == len(rounds) - 1
        if even and world > 1 and (len(rnd) < world or (final and len(rnd[-1]) < unit)):
            cycle = itertools.cycle(initial)
            slots = [(part, len(part)) for part in rnd[:-1]]
            slots.append((rnd[-1] + [next(cycle) for _ in range(unit - len(rnd[-1]))],
                          len(rnd[-1])))
            slots += [([next(cycle) for _ in range(unit)], 0) for _ in range(world - len(rnd))]
        else:
            slots = [(part, len(part)) for part in rnd]
        for rank, slot in enumerate(slots):
            ranks[rank].append(slot)
    return ranks


def _check_rank_steps(steps: list[Any], expected: list[tuple[list[int], int]], world: int,
                      even: bool, final_active: int, final_round: int) -> None:
    real_steps = [s for s in steps if s.payload is not None]
    assert [(list(s.payload), s.real) for s in real_steps] == expected
    assert all(s.size == len(s.payload) for s in real_steps)
    assert [s.last for s in real_steps] == [i == len(expected) - 1 for i in range(len(expected))]
    announced = [(i, a) for i, s in enumerate(steps) for a in s.announce]
    if even or final_active == world:
        assert announced == [] and all(s.active is None for s in steps)
    else:  # every rank creates the subgroup at the same call, max(K - 1, 0), K = final round
        assert announced == [(max(final_round - 1, 0), tuple(range(final_active)))]
        if len(expected) == final_round + 1:  # a member: its last batch uses the subgroup
            assert real_steps[-1].active == tuple(range(final_active))


COMBOS = [(n, bs, w, d, e, s) for n in (0, 1, 2, 3, 5, 7, 8, 13, 16, 31) for bs in (1, 2, 3, 4)
          for w in (1, 2, 3, 4) for d in (False, True) for e in (False, True)
          for s in (False, True) if not s or bs % w == 0]


@pytest.mark.parametrize("n,bs,world,drop_last,even,split", COMBOS)
def test_map_plan_matches_reference(n: int, bs: int, world: int, drop_last: bool, even: bool,
                                    split: bool) -> None:
    reference = _reference(n, bs, world, drop_last, even, split)
    single = [x for b in DataLoader(range(n), batch_size=bs, drop_last=drop_last) for x in b]
    counts = [len(r) for r in reference]
    rounds = max(counts, default=0)
    final_active = sum(1 for c in counts if c == rounds) if rounds else world
    calls: list[int] = []
    for rank in range(world):
        loader = DataLoader(range(n), batch_size=bs, drop_last=drop_last)
        source = MapSource(loader, rank=rank, world=world, even=even, split=split, seed=0)
        pairs = list(source.steps(epoch=0, skip=0))
        steps = [step for _, step in pairs]
        batches = [batch.tolist() for batch, step in pairs if step.payload is not None]
        assert batches == [idx for idx, _ in reference[rank]]
        _check_rank_steps(steps, reference[rank], world, even, final_active, rounds - 1)
        assert len(source) == len(reference[rank])
        calls.append(next((i for i, s in enumerate(steps) if s.announce), -1))
    assert len(set(calls)) == 1  # the subgroup is created at the same call on every rank
    # exactly once, in single-process order
    merged = [x for k in range(max(counts, default=0)) for r in range(world)
              if k < len(reference[r]) for x in reference[r][k][0][:reference[r][k][1]]]
    assert merged == single
    if even and world > 1:
        assert len(set(counts)) == 1
    else:
        assert counts == sorted(counts, reverse=True) and max(counts) - min(counts) <= 1


@pytest.mark.parametrize("world", [2, 3])
def test_iterable_plan_exact(world: int) -> None:
    rng = random.Random(world)
    for _ in range(150):
        n, bs = rng.randint(0, 40), rng.randint(1, 5)
        drop_last, even, split = rng.random() < .5, rng.random() < .5, rng.random() < .4
        if split:
            bs *= world
        single = [x for b in DataLoader(Stream(n), batch_size=bs, drop_last=drop_last) for x in b]
        per_rank = []
        for rank in range(world):
            source = IterableSource(DataLoader(Stream(n), batch_size=bs, drop_last=drop_last),
                                    rank=rank, world=world, even=even, split=split)
            pairs = [(b.tolist(), s) for b, s in source.steps(0, 0) if s.payload is not None]
            assert len(pairs) == len(source), (n, bs, drop_last, even, split)
            assert [s.last for _, s in pairs] == [i == len(pairs) - 1 for i in range(len(pairs))]
            per_rank.append(pairs)
        counts = [len(p) for p in per_rank]
        merged = [x for k in range(max(counts, default=0)) for p in per_rank if k < len(p)
                  for x in p[k][0][:p[k][1].real]]
        assert merged == single, (n, bs, drop_last, even, split)
        assert len(set(counts)) == 1 if even else max(counts) - min(counts) <= 1
        for p in per_rank:  # duplicates are a whole earlier chunk, marked as not real
            for batch, step in p:
                assert step.real in (0, len(batch)) and step.size == len(batch)


def test_known_examples() -> None:
    # even_batches: the short last batch is completed, and ranks without a batch get one,
    # by cycling from the start of the epoch's order (real counts mark the duplicates).
    assert _reference(10, 3, 2, False, True, False) == [
        [([0, 1, 2], 3), ([6, 7, 8], 3)], [([3, 4, 5], 3), ([9, 0, 1], 1)]]
    assert _reference(7, 2, 3, False, True, False) == [
        [([0, 1], 2), ([6, 0], 1)], [([2, 3], 2), ([1, 2], 0)], [([4, 5], 2), ([3, 4], 0)]]
    # drop_last keeps every full batch (no sample of a full batch is lost to sharding)
    assert _reference(7, 2, 2, True, False, False) == [[([0, 1], 2), ([4, 5], 2)],
                                                       [([2, 3], 2)]]
    # split: contiguous pieces; a short last batch leaves rank 1 without a piece
    loader = DataLoader(range(5), batch_size=4)
    got = [[s.payload for _, s in MapSource(loader, rank=r, world=2, even=False, split=True,
                                            seed=0).steps(0, 0)] for r in range(2)]
    assert got == [[[0, 1], [4]], [[2, 3]]]


def test_split_batches_needs_divisible_batch_size() -> None:
    with pytest.raises(ValueError, match="multiple of 3"):
        MapSource(DataLoader(range(8), batch_size=4), rank=0, world=3, even=True, split=True,
                  seed=0)
    with pytest.raises(ValueError, match="multiple of 2"):
        IterableSource(DataLoader(Stream(8), batch_size=3), rank=0, world=2, even=True,
                       split=True)
