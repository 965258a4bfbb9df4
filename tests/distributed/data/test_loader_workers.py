"""accel.data with DataLoader worker processes (``num_workers=2``): batches and bookkeeping match
the in-process loader, and worker seeds follow the seed, rank and epoch, not the global RNG
(moved out of tests/unit/data/test_data.py, which starts no processes)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from accel.config import DataLoaderConfiguration
from accel.data import DataTracker, PreparedDataLoader
from accel.data.selection import select_source
from accel.distributed import Communicator, ProcessContext


def _ctx(rank: int = 0, world: int = 1) -> ProcessContext:
    return ProcessContext(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                          node_rank=0, device=torch.device("cpu"), backend="gloo", launcher="none")


def _prepared(loader: DataLoader, rank: int = 0, world: int = 1, seed: int = 0,
              **config: Any) -> PreparedDataLoader:
    cfg = DataLoaderConfiguration(**{"use_seedable_sampler": True, **config})
    ctx = _ctx(rank, world)
    source = select_source(loader, ctx, cfg, seed, Communicator(_ctx()))
    return PreparedDataLoader(loader, source, ctx=ctx, device=torch.device("cpu"), config=cfg,
                              tracker=DataTracker(), seed=seed)


def test_workers_keep_order_and_bookkeeping() -> None:
    dl = _prepared(DataLoader(range(30), batch_size=4, num_workers=2, shuffle=True,
                              persistent_workers=True), 1, 2, seed=9)
    ref = _prepared(DataLoader(range(30), batch_size=4, shuffle=True), 1, 2, seed=9)
    for _ in range(2):
        got = [(b.tolist(), dl.current_real_len) for b in dl]
        assert got == [(b.tolist(), ref.current_real_len) for b in ref]


class RandomItems(torch.utils.data.Dataset):
    """Each item draws from the worker's torch RNG (random augmentation)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(())


def test_worker_seeds_follow_seed_rank_and_epoch_not_the_global_rng() -> None:
    def draws(rank: int, seed: int = 6, epochs: int = 2) -> list[list[float]]:
        dl = _prepared(DataLoader(RandomItems(), batch_size=2, num_workers=2), rank, 2, seed)
        return [[x for b in dl for x in b.tolist()] for _ in range(epochs)]

    before = torch.get_rng_state()
    first = draws(0)
    assert torch.equal(before, torch.get_rng_state())
    torch.manual_seed(123)  # the global RNG plays no part
    assert draws(0) == first and first[0] != first[1]
    assert draws(1, epochs=1)[0] != first[0] and draws(0, 7, epochs=1)[0] != first[0]
