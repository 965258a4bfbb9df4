"""accel.data with DataLoader worker processes (``num_workers=2``): batches and bookkeeping match
the in-process loader, and worker seeds follow the seed, rank and epoch, not the global RNG
(moved out of tests/unit/data/test_data.py, which starts no processes)."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from tests.unit.data.test_data import _prepared


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
