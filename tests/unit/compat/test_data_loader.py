"""``accel.data_loader``: the names scripts import from ``accelerate.data_loader``.

``prepare_data_loader`` builds any rank's shard in one process (``num_processes=``,
``process_index=``), so the shards of every rank are checked here without a process group; that
they are the same shards and shuffle orders as Accelerate 1.15's is checked against Accelerate
itself in tests/e2e/compat/test_data_loader_vs_accelerate.py.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from accel.data_loader import (
    BatchSamplerShard,
    DataLoaderDispatcher,
    DataLoaderShard,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipBatchSampler,
    SkipDataLoader,
    prepare_data_loader,
    skip_first_batches,
)
from tests.unit.data.test_data import Stream


def _shards(n: int, bs: int, shuffle: bool, split: bool, even: bool) -> list[list[list[int]]]:
    """Two epochs of every rank's batches (as lists), built in this one process."""
    out = []
    for rank in range(2):
        dl = prepare_data_loader(DataLoader(range(n), batch_size=bs, shuffle=shuffle),
                                 num_processes=2, process_index=rank, split_batches=split,
                                 even_batches=even, use_seedable_sampler=True, data_seed=7)
        out.append([b.tolist() for _ in range(2) for b in dl])
    return out


def test_prepare_data_loader_shards_for_any_rank() -> None:
    first, second = _shards(10, 2, False, False, True)
    assert first == [[0, 1], [4, 5], [8, 9]] * 2 and second == [[2, 3], [6, 7], [0, 1]] * 2
    first, second = _shards(8, 4, False, True, True)
    assert first == [[0, 1], [4, 5]] * 2 and second == [[2, 3], [6, 7]] * 2
    shuffled = _shards(10, 2, True, False, False)
    epoch0 = [x for k in range(3) for r in range(2) if k < 5 // 2 + (r < 1)
              for x in shuffled[r][k]]
    assert sorted(epoch0) == list(range(10)) and epoch0 != list(range(10))
    dl = prepare_data_loader(DataLoader(range(4), batch_size=2), torch.device("meta"),
                             put_on_device=True)
    assert isinstance(dl, DataLoaderShard) and next(iter(dl)).device.type == "meta"
    assert next(iter(prepare_data_loader(DataLoader(range(4), batch_size=2),
                                         torch.device("meta")))).device.type == "cpu"


def test_prepared_batch_sampler_is_accelerates_shard() -> None:
    class Batches:  # a user's batch sampler without a torch base class
        batch_size = 2

        def __iter__(self) -> Any:
            return iter([[0, 1], [2, 3], [4, 5]])

        def __len__(self) -> int:
            return 3

    dl = prepare_data_loader(DataLoader(range(6), batch_sampler=Batches()), num_processes=2,
                             process_index=1)
    shard = dl.batch_sampler
    assert isinstance(shard, BatchSamplerShard) and isinstance(shard.batch_sampler, Batches)
    assert (shard.num_processes, shard.process_index, shard.split_batches, shard.even_batches,
            shard.batch_size, shard.drop_last) == (2, 1, False, True, 2, False)
    shuffled = prepare_data_loader(DataLoader(range(6), batch_size=1, shuffle=True),
                                   num_processes=2, process_index=0, use_seedable_sampler=True)
    assert isinstance(shuffled.batch_sampler.batch_sampler.sampler, SeedableRandomSampler)
    shard.even_batches = False  # what join_uneven_inputs(even_batches=False) does
    assert [b.tolist() for b in dl] == [[2, 3]] and len(dl) == 1
    shard.even_batches = True
    assert [b.tolist() for b in dl] == [[2, 3], [0, 1]] and len(dl) == 2


def test_prepare_data_loader_refuses_what_accel_does_not_do() -> None:
    dl = DataLoader(range(4), batch_size=2)
    with pytest.raises(NotImplementedError, match="torch_device_mesh"):
        prepare_data_loader(dl, torch_device_mesh=object())
    with pytest.raises(ValueError, match="process_index=2 is not a rank of num_processes=2"):
        prepare_data_loader(dl, num_processes=2, process_index=2)
    with pytest.warns(UserWarning, match="slice_fn_for_dispatch=...\\) is not used") as caught:
        prepare_data_loader(dl, slice_fn_for_dispatch=lambda *a, **k: a[0])
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # accepted and unused, as by Accelerator(rng_types=...)
        prepare_data_loader(dl, rng_types=["generator"], use_seedable_sampler=True)


def test_iterable_dataset_shard_is_never_made_by_prepare() -> None:
    prepared = prepare_data_loader(DataLoader(range(4), batch_size=2), num_processes=2,
                                   process_index=0)
    assert not isinstance(prepared.dataset, IterableDatasetShard)


def test_data_loader_dispatcher() -> None:
    """Accelerate's constructor; the loaders prepared with dispatch_batches=True are instances
    (built here for one rank of two in one process: every rank then reads for itself)."""
    loader = DataLoaderDispatcher(range(10), batch_size=4, skip_batches=1)
    assert [b.tolist() for b in loader] == [[4, 5, 6, 7], [8, 9]]
    assert not isinstance(prepare_data_loader(DataLoader(range(4), batch_size=2)),
                          DataLoaderDispatcher)
    rank1 = prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=2,
                                process_index=1, dispatch_batches=True)
    assert isinstance(rank1, DataLoaderDispatcher)
    assert [b.tolist() for b in rank1] == [[2, 3], [6, 7], [2, 3]]  # padded last round
    assert [b.tolist() for b in DataLoaderDispatcher(range(8), batch_size=4,
                                                     split_batches=True)] == [[0, 1, 2, 3],
                                                                              [4, 5, 6, 7]]
    with pytest.raises(NotImplementedError, match="no slicing applies"):
        DataLoaderDispatcher(range(4), slice_fn=lambda *a: a)
    # a batch sampler of the user's (here skip_first_batches'): each of its batches is a chunk
    skipped = skip_first_batches(DataLoader(range(10), batch_size=2), 2)
    shards = [prepare_data_loader(skipped, num_processes=2, process_index=r,
                                  dispatch_batches=True) for r in (0, 1)]
    assert [[b.tolist() for b in shard] for shard in shards] == [[[4, 5], [8, 9]],
                                                                 [[6, 7], [6, 7]]]
    assert [len(shard) for shard in shards] == [2, 2]
    shards[0].set_epoch(3)
    assert shards[0].iteration == 3 and skip_first_batches(shards[0], 1).iteration == 3


def test_seedable_random_sampler_orders() -> None:
    sampler = SeedableRandomSampler(range(10), data_seed=5)
    orders = [list(sampler) for _ in range(3)]  # each finished pass moves to the next epoch
    for epoch, order in enumerate(orders):  # epoch e draws from data_seed + e
        generator = torch.Generator().manual_seed(5 + epoch)
        assert order == list(RandomSampler(range(10), generator=generator))
    sampler.set_epoch(1)
    assert list(sampler) == orders[1]
    torch.manual_seed(11)
    assert SeedableRandomSampler(range(3)).initial_seed == 11
    drawn = list(SeedableRandomSampler(range(4), replacement=True, num_samples=9, data_seed=0))
    assert len(drawn) == 9 and set(drawn) <= set(range(4))
    # a prepared shuffled loader in one process: that order, epoch after epoch
    dl = prepare_data_loader(DataLoader(range(10), batch_size=10, shuffle=True), data_seed=5,
                             use_seedable_sampler=True)
    assert [next(iter(dl)).tolist() for _ in range(3)] == orders


def test_accelerates_constructors() -> None:
    batches = BatchSampler(SequentialSampler(range(8)), batch_size=4, drop_last=False)
    assert list(BatchSamplerShard(batches, 2, 0)) == [[0, 1, 2, 3]]
    assert list(BatchSamplerShard(batches, 2, 1, split_batches=True)) == [[2, 3], [6, 7]]
    assert BatchSamplerShard(batches, 2, 0).total_length == 2
    with pytest.raises(ValueError, match="multiple of 3"):
        BatchSamplerShard(batches, 3, 0, split_batches=True)
    skipped = SkipBatchSampler(batches, skip_batches=1)
    assert list(skipped) == [[4, 5, 6, 7]] and len(skipped) == 1 and skipped.total_length == 2
    assert [b.tolist() for b in skip_first_batches(DataLoader(range(5), batch_size=2), 2)] == [
        [4]]



def test_data_loader_shard_built_from_a_dataset() -> None:
    shard = DataLoaderShard(list(range(10)), batch_size=4)  # one process: no sharding
    assert isinstance(shard, DataLoaderShard) and issubclass(type(shard), DataLoaderShard)
    for _ in range(2):  # every pass marks its own last batch
        seen = [(b.tolist(), shard.end_of_dataloader) for b in shard]
        assert seen == [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), ([8, 9], True)]
    moved = DataLoaderShard(range(4), device=torch.device("meta"), batch_size=2)
    assert next(iter(moved)).device.type == "meta"
    assert DataLoaderShard(range(4), batch_size=2, iteration=3).epoch == 3
    with pytest.raises(NotImplementedError, match="skip_first_batches"):
        DataLoaderShard(range(4), batch_size=2, skip_batches=1)
    with pytest.raises(NotImplementedError, match="synchronized_generator"):
        DataLoaderShard(range(4), synchronized_generator=torch.Generator())


def test_skip_data_loader() -> None:
    dl = SkipDataLoader(list(range(10)), skip_batches=2, batch_size=3)
    assert isinstance(dl, DataLoader) and len(dl) == 2
    for _ in range(2):  # every pass skips
        assert [b.tolist() for b in dl] == [[6, 7, 8], [9]]
    assert list(SkipDataLoader(range(4), skip_batches=9, batch_size=2)) == []
    assert len(SkipDataLoader(range(4), skip_batches=9, batch_size=2)) == 0
    with pytest.MonkeyPatch.context() as patch:  # without torchdata (with it: test_stateful.py)
        patch.setitem(sys.modules, "torchdata", None)
        patch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
        with pytest.raises(NotImplementedError, match="use_stateful_dataloader=True"):
            SkipDataLoader(range(4), use_stateful_dataloader=True)
    with pytest.raises(ValueError, match="skip_batches must be >= 0"):
        SkipDataLoader(range(4), skip_batches=-1)


def test_iterable_dataset_shard() -> None:
    def shards(n: int, **kwargs: Any) -> list[list[int]]:
        return [list(IterableDatasetShard(Stream(n), num_processes=2, process_index=r,
                                          **kwargs)) for r in range(2)]

    # groups of 2 x 2 samples, rank r keeping its contiguous 2; the last group cycles the first
    assert shards(7, batch_size=2) == [[0, 1, 4, 5], [2, 3, 6, 0]]
    assert shards(7, batch_size=2, drop_last=True) == [[0, 1], [2, 3]]
    assert shards(7, batch_size=4, split_batches=True) == [[0, 1, 4, 5], [2, 3, 6, 0]]
    assert shards(3, batch_size=4) == [[0, 1, 2, 0], [1, 2, 0, 1]]  # one partial group
    assert shards(3, batch_size=4, drop_last=True) == [[], []]
    assert len(IterableDatasetShard(Stream(7), batch_size=2, num_processes=2)) == 4
    assert len(IterableDatasetShard(Stream(7), batch_size=2, num_processes=2,
                                    drop_last=True)) == 2
    stream = Stream(4)
    shard = IterableDatasetShard(stream, batch_size=2)
    shard.set_epoch(3)
    assert shard.epoch == 3 and stream.epochs == [3]
    with pytest.raises(ValueError, match="round multiple of 2"):
        IterableDatasetShard(stream, batch_size=3, num_processes=2, split_batches=True)


def test_set_epoch_reaches_the_users_batch_sampler_at_once() -> None:
    class Batches(BatchSampler):
        epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    batches = Batches(range(8), batch_size=4, drop_last=False)
    dl = prepare_data_loader(DataLoader(range(8), batch_sampler=batches))
    dl.set_epoch(2)
    assert batches.epoch == 2 and dl.epoch == 2
    assert [b.tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]] and batches.epoch == 2
