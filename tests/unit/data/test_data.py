"""accel.data in one process: the shard plan against a brute-force reference (ranks simulated),
seeded shuffling, exact resume, device transfer, trimming, skipping and tracking."""

from __future__ import annotations

import itertools
import json
import random
import warnings
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

from accel.config import DataLoaderConfiguration
from accel.data import (
    BatchSamplerShard,
    DataTracker,
    PreparedDataLoader,
    SeedableSampler,
    build_prepared_loader,
    send_to_device,
    skip_first_batches,
    trim_batch,
)
from accel.data.selection import select_source
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
    return ProcessContext(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                          node_rank=0, device=torch.device("cpu"), backend="gloo", launcher="none")


def _prepared(loader: DataLoader, rank: int = 0, world: int = 1, seed: int = 0,
              **config: Any) -> PreparedDataLoader:
    cfg = DataLoaderConfiguration(**{"use_seedable_sampler": True, **config})
    ctx = _ctx(rank, world)
    source = select_source(loader, ctx=ctx, config=cfg, seed=seed, comm=Communicator(_ctx()))
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


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_map_plan_matches_reference(world: int) -> None:
    combos = [(n, bs, d, e, s) for n in (0, 1, 2, 3, 5, 7, 8, 13, 16, 31) for bs in (1, 2, 3, 4)
              for d in (False, True) for e in (False, True) for s in (False, True)
              if not s or bs % world == 0]
    for combo in combos:
        try:
            _check_map_plan(*combo, world=world)
        except AssertionError as error:
            raise AssertionError(f"n, bs, drop_last, even, split = {combo}: {error}") from None


def _check_map_plan(n: int, bs: int, drop_last: bool, even: bool, split: bool, *,
                    world: int) -> None:
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
        assert len(source) == len(reference[rank]) and source.num_rounds() == rounds
        calls.append(next((i for i, s in enumerate(steps) if s.announce), -1))
    assert len(set(calls)) == 1  # the subgroup is created at the same call on every rank
    # exactly once, in single-process order
    merged = [x for k in range(rounds) for r in range(world) if k < len(reference[r])
              for x in reference[r][k][0][:reference[r][k][1]]]
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


# -- shuffling ---------------------------------------------------------------------------------
def test_seedable_shuffle_same_on_every_rank_and_new_each_epoch() -> None:
    orders = {}
    for rank in range(3):
        sampler = SeedableSampler(RandomSampler(range(50)), seed=7)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            orders[rank, epoch] = list(sampler)
    for epoch in range(3):
        assert orders[0, epoch] == orders[1, epoch] == orders[2, epoch]
        assert sorted(orders[0, epoch]) == list(range(50))
    assert orders[0, 0] != orders[0, 1] != orders[0, 2]
    other = SeedableSampler(RandomSampler(range(50)), seed=8)
    assert list(other) != orders[0, 0]
    # replacement / num_samples are kept
    drawn = list(SeedableSampler(RandomSampler(range(5), replacement=True, num_samples=12), 1))
    assert len(drawn) == 12 and set(drawn) <= set(range(5))


def test_prepared_shuffle_shards_one_permutation() -> None:
    world = 3
    loaders = [_prepared(DataLoader(range(40), batch_size=4, shuffle=True), r, world, seed=5)
               for r in range(world)]
    for epoch in range(2):
        per_rank = [[b.tolist() for b in dl] for dl in loaders]
        merged = [x for k in range(len(per_rank[0])) for r in range(world)
                  for x in per_rank[r][k]]
        # 40 samples, 10 batches: the last round pads ranks 1 and 2 with duplicates
        real = merged[:40]
        assert sorted(real) == list(range(40)) and all(dl.epoch == epoch for dl in loaders)
        if epoch == 0:
            first = real
    assert real != first  # a new epoch is a new order
    single = _prepared(DataLoader(range(40), batch_size=4, shuffle=True), seed=5)
    assert [x for b in single for x in b.tolist()] == first  # same order as on one process


def test_user_generator_is_replaced_with_a_warning() -> None:
    gen = torch.Generator().manual_seed(3)
    with pytest.warns(UserWarning, match="generator is not used"):
        _prepared(DataLoader(range(8), batch_size=2, shuffle=True, generator=gen))


# -- resume ------------------------------------------------------------------------------------
def _epochs(dl: PreparedDataLoader, n: int) -> list[list[list[int]]]:
    return [[b.tolist() for b in dl] for _ in range(n)]


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_resume_mid_epoch_then_next_epochs(kind: str) -> None:
    def make(seed: int) -> PreparedDataLoader:
        if kind == "map":
            return _prepared(DataLoader(range(23), batch_size=3, shuffle=True), seed=seed)
        return _prepared(DataLoader(Stream(23), batch_size=3), seed=seed)

    full = _epochs(make(11), 3)
    dl = make(11)
    assert [b.tolist() for b in dl] == full[0]
    seen = []
    for i, batch in enumerate(dl):
        seen.append(batch.tolist())
        if i == 3:
            state = json.loads(json.dumps(dl.state_dict()))
            break
    assert seen == full[1][:4] and state["next_epoch"] == 1 and state["next_skip"] == 4
    resumed = make(999)  # another seed argument: the checkpoint's seed wins
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == full[1][4:]
    assert [b.tolist() for b in resumed] == full[2]


def test_resume_boundaries_and_explicit_epoch() -> None:
    dl = _prepared(DataLoader(range(10), batch_size=4, shuffle=True), seed=2)
    assert dl.state_dict()["next_epoch"] == 0
    full = _epochs(_prepared(DataLoader(range(10), batch_size=4, shuffle=True), seed=2), 3)
    for i, _ in enumerate(dl):
        if i == 2:  # saved while the last batch is being used: next is epoch 1's first batch
            state = dl.state_dict()
    assert (state["next_epoch"], state["next_skip"]) == (0, 3)
    after = dl.state_dict()
    assert (after["next_epoch"], after["next_skip"], after["iterating"]) == (1, 0, False)
    for saved in (state, after):
        resumed = _prepared(DataLoader(range(10), batch_size=4, shuffle=True), seed=2)
        resumed.load_state_dict(saved)
        assert _epochs(resumed, 2) == full[1:]
    dl.set_epoch(0)
    assert [b.tolist() for b in dl] == full[0] and dl.epoch == 0


def test_break_then_new_epoch_and_world_size_change() -> None:
    dl = _prepared(DataLoader(range(12), batch_size=2, shuffle=True), seed=4)
    full = _epochs(_prepared(DataLoader(range(12), batch_size=2, shuffle=True), seed=4), 2)
    for batch in dl:
        break
    assert [b.tolist() for b in dl] == full[1]  # a broken loop still ends its epoch
    # two ranks consumed 2 rounds (8 samples); one process resumes with the rest of the epoch
    ranks = [_prepared(DataLoader(range(12), batch_size=2, shuffle=True), r, 2, seed=4)
             for r in range(2)]
    states = []
    for dl2 in ranks:
        for i, _ in enumerate(dl2):
            if i == 1:
                states.append(dl2.state_dict())
                break
    one = _prepared(DataLoader(range(12), batch_size=2, shuffle=True), seed=4)
    one.load_state_dict(states[0])
    assert [b.tolist() for b in one] == full[0][4:]
    three = _prepared(DataLoader(range(12), batch_size=2, shuffle=True), 0, 3, seed=4)
    with pytest.raises(ValueError, match="whole number"):
        three.load_state_dict(states[0])


# -- transfer, trimming, skipping ----------------------------------------------------------------
class Movable:
    def __init__(self) -> None:
        self.moved_to: Any = None

    def to(self, device: Any) -> Movable:  # no non_blocking keyword
        self.moved_to = device
        return self


def test_send_to_device_nested() -> None:
    cpu = torch.device("cpu")
    batch = {"pair": Pair(torch.ones(2), [torch.zeros(1), "text"]), "n": 3,
             "skip": torch.ones(1), "obj": Movable(), "tup": (torch.ones(1),)}
    out = send_to_device(batch, cpu, non_blocking=True, skip_keys="skip")
    assert isinstance(out["pair"], Pair) and out["pair"].label[1] == "text"
    assert out["skip"] is batch["skip"] and out["n"] == 3 and isinstance(out["tup"], tuple)
    assert out["obj"].moved_to == cpu
    assert send_to_device(batch, None) is batch
    meta = send_to_device({"x": torch.ones(2)}, "meta")
    assert meta["x"].device.type == "meta"


def test_trim_batch() -> None:
    data = {"pred": Pair(torch.arange(4), torch.ones(4, 2)), "loss": torch.tensor(2.0),
            "names": ["a", "b", "c", "d"], "other": torch.ones(3)}
    out = trim_batch(data, 4, 1)
    assert out["pred"].pred.tolist() == [0] and out["pred"].label.shape == (1, 2)
    assert out["names"] == ["a"] and out["loss"].item() == 2.0 and out["other"].shape == (3,)
    assert trim_batch(data, 4, 4) is data
    assert trim_batch([torch.arange(2), torch.arange(2)], 2, 0)[0].shape == (0,)


def test_skip_first_batches_plain_and_prepared() -> None:
    assert [b.tolist() for b in skip_first_batches(DataLoader(range(7), batch_size=2), 2)] == [
        [4, 5], [6]]
    assert [b.tolist() for b in skip_first_batches(DataLoader(Stream(7), batch_size=2), 3)] == [
        [6]]
    assert [b for b in skip_first_batches(DataLoader(range(3), batch_size=None), 1)] == [1, 2]
    dl = _prepared(DataLoader(range(9), batch_size=2, shuffle=True), seed=1)
    full = _epochs(_prepared(DataLoader(range(9), batch_size=2, shuffle=True), seed=1), 2)
    view = skip_first_batches(dl, 2)
    assert len(view) == 3 and view.total_batch_size == 2
    assert [b.tolist() for b in view] == full[0][2:]
    assert [b.tolist() for b in dl] == full[1]
    state = {**dl.state_dict(), "next_skip": 2, "next_epoch": 1}
    dl.load_state_dict(state)  # an explicit skip wins, counted from the restored epoch's start
    with pytest.warns(UserWarning, match="starts after batch 1 of that epoch, as asked") as rec:
        assert [b.tolist() for b in skip_first_batches(dl, 1)] == full[1][1:]
    assert rec[0].filename == __file__  # names the line that iterates
    dl.load_state_dict(state)  # the Accelerate habit (load, then skip as many): no double skip
    with pytest.warns(UserWarning, match="not needed"):
        assert [b.tolist() for b in skip_first_batches(dl, 2)] == full[1][2:]
    assert [b.tolist() for b in skip_first_batches(dl, 9)] == []  # not the next epoch
    end = {**state, "next_skip": len(full[1]), "next_epoch": 1}  # saved after epoch 1's last
    dl.load_state_dict(end)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # hand-skipping 0 batches into epoch 2 is just right
        assert [b.tolist() for b in skip_first_batches(dl, 0)] == _epochs(
            _prepared(DataLoader(range(9), batch_size=2, shuffle=True), seed=1), 3)[2]


def test_set_epoch_keeps_a_restored_position_of_that_epoch() -> None:
    full = _epochs(_prepared(DataLoader(range(9), batch_size=2, shuffle=True), seed=1), 3)
    dl = _prepared(DataLoader(range(9), batch_size=2, shuffle=True), seed=1)
    state = {**dl.state_dict(), "next_skip": 2, "next_epoch": 1}
    dl.load_state_dict(state)
    dl.set_epoch(1)  # a script that calls set_epoch(epoch) at every epoch's start
    assert [b.tolist() for b in dl] == full[1][2:]
    dl.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(2\) drops the position"):
        dl.set_epoch(2)
    assert [b.tolist() for b in dl] == full[2]


# -- tracking ------------------------------------------------------------------------------------
def test_tracker_nested_loops_break_and_end_flag() -> None:
    tracker = DataTracker()
    ctx = _ctx()
    cfg = DataLoaderConfiguration()

    def prep(loader: DataLoader) -> PreparedDataLoader:
        return build_prepared_loader(loader, ctx=ctx, comm=Communicator(ctx), device=None,
                                     config=cfg, tracker=tracker, seed=0)

    outer = prep(DataLoader(range(4), batch_size=2))
    inner = prep(DataLoader(range(5), batch_size=2))
    assert prep(outer) is outer
    seen = []
    for _ in outer:
        seen.append(("outer", tracker.active is outer, tracker.end_of_dataloader))
        for i, _ in enumerate(inner):
            seen.append(("inner", tracker.active is inner, tracker.end_of_dataloader))
            if i == 1 and len(seen) < 4:
                break
        assert tracker.active is outer
    assert tracker.active is None and not tracker.end_of_dataloader
    assert seen == [("outer", True, False), ("inner", True, False), ("inner", True, False),
                    ("outer", True, True), ("inner", True, False), ("inner", True, False),
                    ("inner", True, True)]
    assert inner.current_batch_len == 1 and inner.current_real_len == 1
    with pytest.raises(ValueError, match="another Accelerator"):
        build_prepared_loader(outer, ctx=ctx, comm=Communicator(ctx), device=None, config=cfg,
                              tracker=DataTracker(), seed=0)
    with pytest.raises(TypeError, match="DataLoader"):
        prep([1, 2])  # type: ignore[arg-type]


def test_already_sharded_loaders_are_left_alone() -> None:
    ds = list(range(7))
    per_rank = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=False)
        dl = _prepared(DataLoader(ds, batch_size=2, sampler=sampler), rank, 2)
        got = [(b.tolist(), dl.current_real_len, dl.end_of_dataloader) for b in dl]
        per_rank.append(got)
    # DistributedSampler pads rank 1 with sample 0; the real count says so
    assert per_rank[0] == [([0, 2], 2, False), ([4, 6], 2, True)]
    assert per_rank[1] == [([1, 3], 2, False), ([5, 0], 1, True)]
    with pytest.raises(ValueError, match="num_replicas=3"):
        _prepared(DataLoader(ds, sampler=DistributedSampler(ds, num_replicas=3, rank=0)), 0, 2)
    stream = Stream(5)
    stream._distributed = type("Cfg", (), {"rank": 1, "world_size": 2})()  # split by node
    dl = _prepared(DataLoader(stream, batch_size=2), 1, 2)
    assert [b.tolist() for b in dl] == [[0, 1], [2, 3], [4]]  # not sharded a second time
    assert stream.epochs == [0]


class KeyBatches(Dataset):
    """Fetches a whole batch at once when indexed with a list (as Accelerate's test dataset)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        rows = [{"idx": i} for i in ([index] if isinstance(index, int) else list(index))]
        return rows[0] if isinstance(index, int) else rows


def _batch_sampler_as_sampler(sampler: Any, n: int, bs: int = 4) -> DataLoader:
    return DataLoader(KeyBatches(n), sampler=BatchSampler(sampler, bs, False), batch_size=None,
                      collate_fn=default_collate)


def test_batch_sampler_passed_as_sampler_is_sharded_by_batch() -> None:
    per_rank = []
    for rank in range(2):
        dl = _prepared(_batch_sampler_as_sampler(SequentialSampler(range(9)), 9), rank, 2)
        per_rank.append([(b["idx"].tolist(), dl.current_real_len) for b in dl])
        assert (dl.batch_size, dl.total_batch_size, len(dl)) == (4, 8, 2)
    # Accelerate's BatchSamplerShard: whole batches dealt round-robin, the short last batch and
    # the missing one completed from the epoch's start and marked as padding
    assert per_rank[0] == [([0, 1, 2, 3], 4), ([8, 0, 1, 2], 1)]
    assert per_rank[1] == [([4, 5, 6, 7], 4), ([3, 4, 5, 6], 0)]
    # shuffled: one seeded permutation on both ranks, whatever each rank's global RNG did
    orders = []
    for rank in range(2):
        torch.manual_seed(rank)
        dl = _prepared(_batch_sampler_as_sampler(RandomSampler(range(22)), 22), rank, 2)
        orders.append([b["idx"].tolist() for b in dl])
    flat = [i for k in range(3) for r in range(2) for i in orders[r][k]]
    assert sorted(flat[:22]) == list(range(22)) and flat[22:] == flat[:2]


def test_batch_sampler_passed_as_sampler_over_distributed_sampler_is_left_alone() -> None:
    epochs = []
    for rank in range(2):
        sampler = DistributedSampler(range(7), num_replicas=2, rank=rank, seed=5)
        dl = _prepared(_batch_sampler_as_sampler(sampler, 7, bs=2), rank, 2)
        epochs.append([[i for b in dl for i in b["idx"].tolist()] for _ in range(2)])
        assert sampler.epoch == 1  # set_epoch reaches the sampler inside the batch sampler
    for epoch in range(2):
        assert sorted(set(epochs[0][epoch] + epochs[1][epoch])) == list(range(7))
    assert epochs[0][0] != epochs[0][1]


def test_lengths_and_attributes() -> None:
    dl = _prepared(DataLoader(range(9), batch_size=3, num_workers=0), 1, 2,
                   even_batches=False)
    assert len(dl) == 1 and dl.batch_size == 3 and dl.total_batch_size == 6
    assert dl.total_dataset_length == 9 and dl.num_workers == 0
    split = _prepared(DataLoader(range(10), batch_size=4), 1, 2, split_batches=True)
    assert split.batch_size == 2 and split.total_batch_size == 4 and len(split) == 3
    with pytest.raises(TypeError):
        len(_prepared(DataLoader(iter_dataset := _NoLen(), batch_size=2)))
    del iter_dataset


class _NoLen(IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(3))


# -- join_uneven_inputs --------------------------------------------------------------------------
def test_join_uneven_inputs_outside_ddp() -> None:
    """Non-DDP distributed strategies warn, as Accelerate does for everything but multi-GPU
    (accel's DDP joins on CPU too); one process neither warns nor changes its loaders."""
    from accel import Accelerator
    from accel.strategy.xla import XLAStrategy

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(1, 1))
    dl = acc.prepare(DataLoader(range(3), batch_size=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with acc.join_uneven_inputs([model], even_batches=False):
            assert [b.tolist() for b in dl] == [[0], [1], [2]]
    xla = XLAStrategy(_ctx(0, 2))  # 2 XLA processes: torch Join has no meaning there
    assert not xla.joins_uneven_inputs
    acc._step.strategy = xla  # as if this Accelerator ran on 2 XLA devices
    with pytest.warns(UserWarning, match="only supported for multi-GPU.*with XLA") as caught, \
            acc.join_uneven_inputs([model], even_batches=False):
        assert len(dl) == 3  # not overridden (nothing to override in one process anyway)
    assert caught[0].filename == __file__


def test_default_mode_state_keeps_the_generator_of_the_pass() -> None:
    """use_seedable_sampler=False: the state holds the sampler generator's state at the start
    of the pass it resumes in (after the pass's last batch: its state for the next epoch), so a
    loader whose own generator differs replays the same orders; a state without it warns."""
    def loader(seed: int) -> PreparedDataLoader:
        torch.manual_seed(seed)  # prepare() seeds the sampler's new generator from this
        return _prepared(DataLoader(range(8), batch_size=2, shuffle=True),
                         use_seedable_sampler=False, use_stateful_dataloader=True)

    ref = loader(1)
    epochs = [[b.tolist() for b in ref] for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    dl = loader(1)
    states = []
    for epoch in range(2):
        for _ in dl:
            if epoch == 1:
                states.append(dl.state_dict())
    assert all(s["version"] == 3 and s["generator"].dtype == torch.uint8 for s in states)
    for skip, state in enumerate(states, start=1):  # mid epoch 1, then after its last batch
        other = loader(2)
        assert [b.tolist() for b in other] != epochs[0]  # its own generator differs
        other.load_state_dict(state)
        assert torch.equal(other.state_dict()["generator"], state["generator"])  # not iterated
        rest = [b.tolist() for b in other]
        assert rest == (epochs[1][skip:] if skip < 4 else epochs[2])
    with pytest.warns(UserWarning, match="shuffled in another order"):
        loader(2).load_state_dict({k: v for k, v in states[0].items() if k != "generator"})


def test_batches_of_varying_size_pad_with_whole_first_batches() -> None:
    # no nominal batch size: missing ranks get whole batches of the first round, cycling
    batches = [[0], [1, 2], [3, 4, 5], [6], [7, 8], [9, 10, 11], [12, 13]]
    shards = [list(BatchSamplerShard(batches, 3, r)) for r in range(3)]
    assert shards == [[[0], [6], [12, 13]], [[1, 2], [7, 8], [0]],
                      [[3, 4, 5], [9, 10, 11], [1, 2]]]
    assert [list(BatchSamplerShard([[0, 1, 2]], 3, r)) for r in range(3)] == [[[0, 1, 2]]] * 3
    steps = list(BatchSamplerShard(batches, 3, 1).steps())
    assert [(s.payload, s.size, s.real) for s in steps][-1] == ([0], 1, 0)  # marked padding
    # a nominal batch size still completes the short batch from the first samples
    sized = torch.utils.data.BatchSampler(range(7), batch_size=3, drop_last=False)
    assert list(BatchSamplerShard(sized, 2, 0)) == [[0, 1, 2], [6, 0, 1]]
    assert list(BatchSamplerShard(sized, 2, 1)) == [[3, 4, 5], [2, 3, 4]]
