"""accel.data.stateful: with torchdata installed, loaders prepared with
``use_stateful_dataloader=True`` are torchdata ``StatefulDataLoader``s that keep accel's
sharding, exact resume (accel's state format) and ``end_of_dataloader``; without torchdata
(simulated by making its import fail) they are plain ``PreparedDataLoader``s as before."""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from accel import Accelerator, DataLoaderConfiguration
from accel.data import PreparedDataLoader
from accel.data.loader import prepared_loader_class
from accel.data.stateful import stateful_dataloader_class, stateful_variant
from accel.data_loader import (
    DataLoaderDispatcher,
    DataLoaderShard,
    SkipDataLoader,
    prepare_data_loader,
)

_REASON = ("torchdata is not installed (pip install torchdata, or accel[stateful]): the "
           "StatefulDataLoader variant is optional")


@pytest.fixture
def stateful() -> type[Any]:
    pytest.importorskip("torchdata.stateful_dataloader", reason=_REASON)
    found = stateful_dataloader_class()
    assert found is not None
    return found


@pytest.fixture
def no_torchdata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchdata", None)  # `import torchdata...` now fails
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)


def _shard(rank: int = 0, world: int = 1, n: int = 10, **kwargs: Any) -> Any:
    return prepare_data_loader(DataLoader(list(range(n)), batch_size=2), num_processes=world,
                               process_index=rank, data_seed=0, **kwargs)


def _lists(batches: Any) -> list[list[int]]:
    return [b.tolist() for b in batches]


def test_prepared_loader_is_a_stateful_dataloader_and_keeps_accels_class(
        stateful: type[Any]) -> None:
    loader = _shard(use_stateful_dataloader=True)
    assert isinstance(loader, stateful) and isinstance(loader, DataLoader)
    assert isinstance(loader, PreparedDataLoader) and isinstance(loader, DataLoaderShard)
    assert type(loader) is prepared_loader_class(DataLoaderConfiguration(
        use_stateful_dataloader=True))  # one class per process
    assert type(loader).__name__ == "StatefulPreparedDataLoader"
    # accel's methods win over torchdata's (iteration, length, state)
    assert type(loader).state_dict is PreparedDataLoader.state_dict
    assert type(loader).__iter__ is PreparedDataLoader.__iter__
    # DataLoader attributes still come from the user's loader
    assert (loader.num_workers, loader.multiprocessing_context, loader.use_stateful_dataloader) \
        == (0, None, True)
    assert not isinstance(_shard(), stateful)  # only with use_stateful_dataloader=True


def test_iteration_sharding_and_end_of_dataloader_are_accels(stateful: type[Any]) -> None:
    one = _shard(use_stateful_dataloader=True)
    seen = [(b.tolist(), one.end_of_dataloader) for b in one]
    assert seen == [([0, 1], False), ([2, 3], False), ([4, 5], False), ([6, 7], False),
                    ([8, 9], True)]
    assert len(one) == 5
    # another rank's shard, built in this process: batches 1 and 3, then padding from the start
    rank1 = _shard(rank=1, world=2, use_stateful_dataloader=True)
    assert isinstance(rank1, stateful)
    assert _lists(rank1) == [[2, 3], [6, 7], [0, 1]] == _lists(_shard(rank=1, world=2))
    assert len(rank1) == 3


def test_mid_epoch_state_resumes_exactly_in_a_new_loader(stateful: type[Any]) -> None:
    loader = _shard(rank=1, world=2, n=14, use_stateful_dataloader=True)
    it = iter(loader)
    assert next(it).tolist() == [2, 3]
    state = loader.state_dict()
    assert (state["version"], state["next_skip"], state["world_size"]) == (3, 1, 2)
    rest = _lists(it)
    fresh = _shard(rank=1, world=2, n=14, use_stateful_dataloader=True)
    fresh.load_state_dict(state)
    assert _lists(fresh) == rest == [[6, 7], [10, 11], [0, 1]]
    # and a plain PreparedDataLoader reads the same state (one format)
    plain = _shard(rank=1, world=2, n=14)
    plain.load_state_dict(state)
    assert _lists(plain) == rest


def test_shuffled_resume_keeps_the_order(stateful: type[Any]) -> None:
    def make() -> Any:
        return prepare_data_loader(DataLoader(list(range(12)), batch_size=2, shuffle=True),
                                   num_processes=1, process_index=0, data_seed=7,
                                   use_seedable_sampler=True, use_stateful_dataloader=True)

    loader = make()
    it = iter(loader)
    next(it), next(it)
    state, rest = loader.state_dict(), _lists(it)
    fresh = make()
    fresh.load_state_dict(state)
    assert _lists(fresh) == rest and len(rest) == 4


def test_save_state_and_load_state_resume_the_stateful_loader(
        stateful: type[Any], tmp_path: Path) -> None:
    def prepare() -> tuple[Accelerator, Any]:
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
            use_stateful_dataloader=True))
        return acc, acc.prepare(DataLoader(list(range(10)), batch_size=2))

    acc, loader = prepare()
    assert isinstance(loader, stateful)
    it = iter(loader)
    next(it), next(it)
    acc.save_state(str(tmp_path / "ckpt"))
    rest = _lists(it)
    other, twin = prepare()
    other.load_state(str(tmp_path / "ckpt"))
    ends = []
    for batch in twin:
        assert torch.equal(other.gather_for_metrics(batch), batch)  # tracked by its Accelerator
        ends.append((batch.tolist(), other.gradient_state.end_of_dataloader))
    assert ends == [([4, 5], False), ([6, 7], False), ([8, 9], True)]
    assert [b for b, _ in ends] == rest


def test_skip_first_batches_and_prepare_again_treat_it_as_prepared(
        stateful: type[Any]) -> None:
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=True))
    loader = acc.prepare(DataLoader(list(range(10)), batch_size=2))
    assert acc.prepare(loader) is loader  # not re-prepared as a plain DataLoader
    skipped = acc.skip_first_batches(loader, 2)  # keeps the sharding and the tracking
    ends = [(b.tolist(), acc.gradient_state.end_of_dataloader) for b in skipped]
    assert ends == [([4, 5], False), ([6, 7], False), ([8, 9], True)]


def test_pickle_and_deepcopy_keep_the_variant(stateful: type[Any]) -> None:
    loader = _shard(rank=1, world=2, use_stateful_dataloader=True)
    for copied in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert type(copied) is type(loader) and isinstance(copied, stateful)
        assert _lists(copied) == [[2, 3], [6, 7], [0, 1]]


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's __init__
def test_dispatcher_and_skip_loader_are_stateful_too(stateful: type[Any]) -> None:
    dispatcher = DataLoaderDispatcher(range(6), batch_size=4, use_stateful_dataloader=True)
    assert isinstance(dispatcher, stateful) and isinstance(dispatcher, DataLoaderDispatcher)
    assert [(b.tolist(), dispatcher.end_of_dataloader) for b in dispatcher] == \
        [([0, 1, 2, 3], False), ([4, 5], True)]
    skip = SkipDataLoader(list(range(8)), skip_batches=1, batch_size=2,
                          use_stateful_dataloader=True)
    assert isinstance(skip, stateful) and isinstance(skip, SkipDataLoader)
    assert skip.use_stateful_dataloader
    assert _lists(skip) == [[2, 3], [4, 5], [6, 7]] and len(skip) == 3
    # torchdata's own state (counting the skipped batch, as Accelerate's)
    it = iter(skip)
    next(it)
    state = skip.state_dict()
    assert state["_num_yielded"] == 2
    again = SkipDataLoader(list(range(8)), skip_batches=1, batch_size=2,
                           use_stateful_dataloader=True)
    again.load_state_dict(state)
    assert _lists(again) == [[6, 7]]
    assert type(SkipDataLoader(range(4), batch_size=2)) is SkipDataLoader
    assert isinstance(DataLoaderShard(range(4), batch_size=2, use_stateful_dataloader=True),
                      stateful)


def test_variant_of_a_stateful_class_is_itself(stateful: type[Any]) -> None:
    variant = stateful_variant(PreparedDataLoader)
    assert variant is not None and stateful_variant(variant) is variant
    assert stateful_variant(PreparedDataLoader) is variant
    assert variant.__mro__[1:3] == (PreparedDataLoader, stateful)


def test_without_torchdata_the_old_class_is_returned(no_torchdata: None) -> None:
    assert stateful_dataloader_class() is None
    assert stateful_variant(PreparedDataLoader) is None
    loader = _shard(rank=1, world=2, use_stateful_dataloader=True)
    assert type(loader) is PreparedDataLoader and not isinstance(loader, DataLoader)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    fresh = _shard(rank=1, world=2, use_stateful_dataloader=True)
    fresh.load_state_dict(state)
    assert _lists(fresh) == [[6, 7], [0, 1]]
    with pytest.raises(NotImplementedError, match="pip install torchdata"):
        SkipDataLoader(range(4), use_stateful_dataloader=True)
    assert type(SkipDataLoader(range(4), batch_size=2)) is SkipDataLoader


def test_unpickling_without_torchdata_gives_the_base_class(
        stateful: type[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    data = pickle.dumps(_shard(use_stateful_dataloader=True))
    monkeypatch.setitem(sys.modules, "torchdata", None)
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    loaded = pickle.loads(data)
    assert type(loaded) is PreparedDataLoader
    assert _lists(loaded) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_loader_state_holds_no_torch_objects_but_the_generator(stateful: type[Any]) -> None:
    state = _shard(use_stateful_dataloader=True).state_dict()
    assert all(not isinstance(v, torch.Tensor) for k, v in state.items() if k != "generator")
