"""Exactness of the metrics gather over prepared loaders, with real processes.

Each worker loops over many (length, batch size, drop_last, even_batches, split_batches,
map-style/iterable, shuffle) combinations, drawn from one seeded RNG so every rank draws the
same ones. At every batch it gathers the trimmed batch (on ``metrics_group`` when set) exactly
as ``Accelerator.gather_for_metrics`` does; the concatenation over the epoch must be the
single-process order, every sample once. Ranks without a batch in an uneven last round do not
take part in that gather, so their result must be a prefix; rank 0 always has the whole.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from tests.spawn import cpu_group, run_workers


class Indexed(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"idx": index, "x": torch.full((1 + index % 3,), float(index))[:1]}


class Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return ({"idx": i, "x": torch.tensor([float(i)])} for i in range(self.n))




def _combos(world: int, count: int, seed: int) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    # hand-picked uneven endings first: a last round of 1 rank, a single partial round, ...
    picked = [(9, 2, False, False, False, "map", False), (3, 2, False, False, False, "map", False),
              (1, 1, False, False, False, "iterable", False),
              (2 * world + 1, 2 * world, False, False, True, "map", True),
              (5, 3, True, False, False, "iterable", False)]
    out = list(picked)
    while len(out) < count:
        split = rng.random() < 0.3
        sizes = [b for b in range(1, 9) if b % world == 0] if split else list(range(1, 9))
        out.append((rng.randint(1, 300), rng.choice(sizes), rng.random() < 0.3,
                    rng.random() < 0.5, split, rng.choice(["map", "iterable"]),
                    rng.random() < 0.3))
    return out


def _expected(n: int, bs: int, drop_last: bool, kind: str, order: list[int] | None) -> list[int]:
    if order is not None:  # shuffled: the one-process order of the same seeded sampler
        return order
    data = Indexed(n) if kind == "map" else Stream(n)
    return [i for b in DataLoader(data, batch_size=bs, drop_last=drop_last) for i in b["idx"]]


def _exactness_worker(rank: int, count: int, seed: int) -> dict[str, Any]:
    from accel.config import DataLoaderConfiguration
    from accel.data import DataTracker, build_prepared_loader
    from accel.distributed import Communicator, ProcessContext

    ctx, comm, group = cpu_group()
    world = ctx.world_size
    tracker = DataTracker()
    solo = ProcessContext.single()
    failures, checked, subgroups = [], 0, 0
    for combo in _combos(world, count, seed):
        n, bs, drop_last, even, split, kind, shuffle = combo
        # seeded shuffling (data_seed + epoch), so that the one-process order is the reference
        cfg = DataLoaderConfiguration(even_batches=even, split_batches=split,
                                      use_seedable_sampler=True)

        def make(context: Any, communicator: Any) -> Any:
            data = Indexed(n) if kind == "map" else Stream(n)
            loader = DataLoader(data, batch_size=bs, drop_last=drop_last,
                                shuffle=shuffle and kind == "map")
            return build_prepared_loader(loader, ctx=context, comm=communicator, device=None,
                                         config=cfg, tracker=tracker, seed=seed)

        order = None
        if shuffle and kind == "map":
            order = [i for b in make(solo, Communicator(solo)) for i in b["idx"].tolist()]
        loader = make(ctx, comm)
        got: list[int] = []
        batches = 0
        for batch in loader:
            batches += 1
            out = {"idx": batch["idx"], "nested": (batch["x"] * 2, [batch["idx"] > -1])}
            gathered = comm.gather(loader.trim_for_metrics(out), group=loader.metrics_group)
            subgroups += loader.metrics_group is not None
            assert gathered["nested"][1][0].dtype == torch.bool
            assert gathered["nested"][0].shape[0] == gathered["idx"].shape[0]
            got += gathered["idx"].tolist()
        expected = _expected(n, bs, drop_last, kind, order)
        ok = got == expected if rank == 0 else got == expected[:len(got)]
        if not ok or batches != len(loader):
            failures.append((combo, got[:20], expected[:20], batches, len(loader)))
        checked += 1
    group.close()
    return {"failures": failures[:3], "checked": checked, "subgroups": subgroups}


@pytest.mark.parametrize("world,count", [(2, 160), (3, 120), (4, 60)])
def test_gather_for_metrics_exact(world: int, count: int) -> None:
    results = run_workers(_exactness_worker, world, args=(count, 1234 + world), timeout=120)
    for rank, result in enumerate(results):
        assert result["failures"] == [], f"rank {rank}: {result['failures']}"
        assert result["checked"] == count
    assert results[0]["subgroups"] > 0  # uneven last rounds were really exercised
