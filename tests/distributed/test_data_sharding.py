"""Prepared loaders across real processes: one seeded permutation per epoch, workers, breaking
out of a loop, already-sharded loaders left alone, resume, and ranks that disagree."""

from __future__ import annotations

import multiprocessing
from typing import Any

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
    get_worker_info,
)

from tests.spawn import cpu_group, run_workers


class WorkerStream(IterableDataset):
    """Splits itself across DataLoader workers (as well-behaved iterable datasets do)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))




def _epoch(loader: Any, comm: Any) -> list[int]:
    """Every rank's gathered real samples of one pass (as gather_for_metrics does)."""
    out: list[int] = []
    for batch in loader:
        out += comm.gather(loader.trim_for_metrics(batch), group=loader.metrics_group).tolist()
    return out


def _resume(prep: Any, comm: Any) -> tuple[bool, int]:
    """Resume mid-epoch from every rank's own state, in a new loader with another seed (seeded
    shuffling: the reference is the same seed's order)."""
    first = prep(DataLoader(range(30), batch_size=2, shuffle=True), seed=8,
                 use_seedable_sampler=True)
    seen: list[int] = []
    for i, batch in enumerate(first):
        seen += comm.gather(batch).tolist()
        if i == 2:
            state = first.state_dict()
            break
    second = prep(DataLoader(range(30), batch_size=2, shuffle=True), seed=99,
                  use_seedable_sampler=True)
    second.load_state_dict(state)
    rest = _epoch(second, comm)
    reference = prep(DataLoader(range(30), batch_size=2, shuffle=True), seed=8,
                     use_seedable_sampler=True)
    return seen + rest == _epoch(reference, comm), len(rest)


def _sharding_worker(rank: int) -> dict[str, Any]:
    from accel.config import DataLoaderConfiguration
    from accel.data import DataTracker, build_prepared_loader

    # tests.spawn starts daemonic children, which may not start DataLoader workers; these
    # workers are joined by their DataLoader before this function returns. They are started
    # through a forkserver, not forked from this rank: forking a process that runs gloo's
    # threads deadlocked a worker about once in 20 runs (a lock held at fork time), which is
    # torch's hazard, not the data layer's. persistent_workers keeps the start-up cost to one.
    multiprocessing.current_process().daemon = False
    ctx, comm, group = cpu_group()
    tracker = DataTracker()

    def prep(loader: DataLoader, seed: int = 3, **cfg: Any) -> Any:
        return build_prepared_loader(loader, ctx=ctx, comm=comm, device=torch.device("cpu"),
                                     config=DataLoaderConfiguration(**cfg), tracker=tracker,
                                     seed=seed)

    out: dict[str, Any] = {"rank": rank, "world": ctx.world_size}
    # shuffled, with worker processes: every rank's shard of one permutation, new each epoch
    shuffled = prep(DataLoader(range(50), batch_size=4, shuffle=True, num_workers=2,
                                multiprocessing_context="forkserver", persistent_workers=True))
    out["mine"] = [[b.tolist() for b in shuffled] for _ in range(2)]
    # break out of an uneven epoch on every rank, then run whole epochs (subgroup reused)
    uneven = prep(DataLoader(range(11), batch_size=2), even_batches=False)
    for i, _ in enumerate(uneven):
        if i == 0:
            break
    out["after_break"] = [_epoch(uneven, comm) for _ in range(2)]
    out["tracker_idle"] = tracker.active is None
    # an iterable dataset split across 2 workers: sharded by rank once, nothing lost
    stream = prep(DataLoader(WorkerStream(37), batch_size=3, num_workers=2,
                             multiprocessing_context="forkserver"), even_batches=False)
    out["stream"] = sorted(_epoch(stream, comm))
    # a DistributedSampler built for this job is left alone; its padding is trimmed
    ds = list(range(13))
    sampler = DistributedSampler(ds, num_replicas=ctx.world_size, rank=rank, shuffle=True)
    out["dist_sampler"] = [sorted(_epoch(prep(DataLoader(ds, batch_size=2, sampler=sampler)),
                                         comm)) for _ in range(1)]
    out["dist_epoch_set"] = sampler.epoch
    out["resume"] = _resume(prep, comm)
    # ranks that prepare different datasets are told so instead of sharding garbage
    try:
        prep(DataLoader(range(10 + rank), batch_size=2))
        out["mismatch"] = "no error"
    except ValueError as error:
        out["mismatch"] = str(error)
    group.close()
    return out


def test_sharding_across_processes() -> None:
    world = 3
    results = run_workers(_sharding_worker, world, timeout=120)
    for epoch in range(2):
        rounds = len(results[0]["mine"][epoch])
        merged = [x for k in range(rounds) for r in results for x in r["mine"][epoch][k]]
        assert sorted(merged[:50]) == list(range(50))  # the rest are marked duplicates
        assert len({len(r["mine"][epoch]) for r in results}) == 1  # even batches
    assert results[0]["mine"][0] != results[0]["mine"][1]
    # rank 0 always takes part in every gather; ranks without a batch in an uneven last round
    # miss that round's gather only
    assert results[0]["after_break"] == [list(range(11))] * 2
    assert results[0]["stream"] == list(range(37))
    for r in results:
        assert all(got == list(range(11))[:len(got)] for got in r["after_break"])
        assert r["tracker_idle"]
        assert set(r["stream"]) <= set(range(37))
        assert r["dist_sampler"] == [list(range(13))] and r["dist_epoch_set"] == 0
        assert r["resume"] == (True, 2 * world * 2)
        assert "different data loaders" in r["mismatch"] and "rank 1" in r["mismatch"]


# -- a BatchSampler passed as sampler= with batch_size=None (Accelerate's
# test_distributed_data_loop.py "sampler as an instance of BatchSampler") ---------------------
class KeyBatches(Dataset):
    """Indexed with a list of indices, returns that whole batch (as Accelerate's DummyDataset)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        rows = [{"index": i, "label": i % 2} for i in ([index] if isinstance(index, int)
                                                      else list(index))]
        return rows[0] if isinstance(index, int) else rows


#: (length, shuffle, even_batches, split_batches): uneven lengths, a partial last round
BATCH_SAMPLER_CASES = [(22, False, True, False), (21, True, True, False), (9, False, True, False),
                       (9, False, False, False), (3, True, False, False), (21, True, True, True),
                       (9, False, False, True)]


def _batch_sampler_worker(rank: int) -> dict[Any, Any]:
    from accel import Accelerator, DataLoaderConfiguration

    out: dict[Any, Any] = {}
    for n, shuffle, even, split in BATCH_SAMPLER_CASES:
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
            even_batches=even, split_batches=split))
        inner = RandomSampler(range(n)) if shuffle else SequentialSampler(range(n))
        loader = acc.prepare(DataLoader(KeyBatches(n), sampler=BatchSampler(inner, 4, False),
                                        batch_size=None, collate_fn=default_collate))
        torch.rand(rank + 1)  # the ranks' global RNGs differ, as after a real training step
        mine, gathered = [], []
        for batch in loader:
            mine.append(batch["index"].tolist())
            index, label = acc.gather_for_metrics((batch["index"], batch["label"]))
            assert label.tolist() == [i % 2 for i in index.tolist()]
            gathered += index.tolist()
        out[(n, shuffle, even, split)] = (mine, gathered, len(loader))
    return out


def test_batch_sampler_as_sampler_each_sample_once() -> None:
    results = run_workers(_batch_sampler_worker, 2, timeout=120)
    for case in BATCH_SAMPLER_CASES:
        n, shuffle, even, split = case
        (mine0, got0, len0), (mine1, got1, len1) = (r[case] for r in results)
        assert (len0, len1) == (len(mine0), len(mine1)), case
        # every sample exactly once; in the one-process order (rank 0 takes part in every
        # gather; rank 1 misses the last one when it has no batch in the last round)
        assert sorted(got0) == list(range(n)), (case, got0)
        assert got1 == got0[:len(got1)], case
        if not shuffle:
            assert got0 == list(range(n)), case
    # as Accelerate's BatchSamplerShard: whole batches round-robin, padded from the start
    assert results[0][(9, False, True, False)][0] == [[0, 1, 2, 3], [8, 0, 1, 2]]
    assert results[1][(9, False, True, False)][0] == [[4, 5, 6, 7], [3, 4, 5, 6]]
    assert results[0][(9, False, False, False)][0] == [[0, 1, 2, 3], [8]]
    assert results[1][(9, False, False, False)][0] == [[4, 5, 6, 7]]
    assert results[0][(9, False, False, True)][0] == [[0, 1], [4, 5], [8]]
    assert results[1][(9, False, False, True)][0] == [[2, 3], [6, 7]]
