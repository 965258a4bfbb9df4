"""Rank-local iterable streams (issue 26): data a user already split by rank is never cut again.

One 2-process spawn checks: the issue's case (each rank's own 8 items; before the fix each rank
kept 4 of them without a word), detection by first batches and by lengths (one warning naming
``already_sharded``), the flag itself, streams of unequal length and an empty one (every rank takes
the same number of steps, so DDP training does not hang, and ``gather_for_metrics`` returns every
sample once), a global stream that is still split, Hugging Face ``split_dataset_by_node`` and
webdataset ``split_by_node`` recognised as pre-split, exact resume through
``save_state``/``load_state``, and the errors (the flag on a map-style dataset, ranks that
disagree on the flag).
"""

from __future__ import annotations

import io
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.spawn import run_workers


class Own(IterableDataset):
    """``items`` of this rank's own (rank-local: what each rank reads differs)."""

    def __init__(self, items: list[int], length: bool = False) -> None:
        self.items = items
        self.length = length

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        if not self.length:
            raise TypeError("no length")
        return len(self.items)


def _accelerator(**config: Any) -> Any:
    from accel import Accelerator
    from accel.config import DataLoaderConfiguration

    return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))


def _pass(acc: Any, loader: Any) -> tuple[list[int], list[int], list[int]]:
    """(this rank's batches' samples, real counts per step, every rank's gathered samples)."""
    mine: list[int] = []
    reals: list[int] = []
    gathered: list[int] = []
    for batch in loader:
        mine += batch.tolist()
        reals.append(loader.current_real_len)
        gathered += acc.gather_for_metrics(batch).tolist()
    return mine, reals, gathered


def _caught(fn: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, [str(w.message) for w in caught if "already_sharded" in str(w.message)]


def _wds_shards(root: Path) -> list[str]:
    """Four webdataset tar shards of 3 samples each (sample value = shard * 10 + i)."""
    root.mkdir(parents=True, exist_ok=True)
    urls = []
    for shard in range(4):
        path = root / f"shard-{shard}.tar"
        if not path.exists():
            with tarfile.open(path, "w") as tar:
                for i in range(3):
                    data = str(shard * 10 + i).encode()
                    info = tarfile.TarInfo(f"s{shard}_{i}.cls")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        urls.append(str(path))
    return urls


def _basic(rank: int, out: dict[str, Any]) -> Any:
    acc = _accelerator()
    own = [rank * 100 + i for i in range(8)]
    out["issue"], out["issue_warn"] = _caught(
        lambda: _pass(acc, acc.prepare(DataLoader(Own(own), batch_size=2))))
    # lengths that differ: decided at prepare (len() answers the longest rank's steps)
    differ = Own([rank * 100 + i for i in range(5 + 4 * rank)], length=True)
    prepared, out["by_length_warn"] = _caught(lambda: acc.prepare(DataLoader(differ,
                                                                             batch_size=2)))
    out["len_by_length"] = len(prepared)
    out["by_length"] = _pass(acc, prepared)
    # a global stream is still split, without a warning
    out["global"], out["global_warn"] = _caught(
        lambda: _pass(acc, acc.prepare(DataLoader(Own(list(range(8))), batch_size=2))))
    return acc


def _flagged(rank: int, acc: Any, out: dict[str, Any]) -> None:
    from accel.config import DataLoaderConfiguration

    acc.dataloader_config = DataLoaderConfiguration(already_sharded=True)
    uneven = [rank * 100 + i for i in range(5 + 4 * rank)]  # 5 and 9 items
    out["uneven"], out["uneven_warn"] = _caught(
        lambda: _pass(acc, acc.prepare(DataLoader(Own(uneven), batch_size=2))))
    empty = [] if rank == 0 else [100, 101, 102]
    out["empty"] = _pass(acc, acc.prepare(DataLoader(Own(empty), batch_size=2)))
    # DDP training over streams of unequal length: every rank steps as often, nothing hangs
    model = torch.nn.Linear(1, 1)
    model, opt, dl = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01),
                                 DataLoader(Own([float(x) for x in uneven]), batch_size=2))
    steps = 0
    for batch in dl:
        acc.backward(model(batch.reshape(-1, 1).float()).sum())
        opt.step()
        opt.zero_grad()
        steps += 1
    out["ddp_steps"] = steps


def _recognised(rank: int, acc: Any, root: Path, out: dict[str, Any]) -> None:
    import webdataset as wds
    from datasets import Dataset
    from datasets.distributed import split_dataset_by_node

    from accel.config import DataLoaderConfiguration

    acc.dataloader_config = DataLoaderConfiguration()
    hf = split_dataset_by_node(Dataset.from_dict({"x": list(range(9))}).to_iterable_dataset(
        num_shards=1), rank=rank, world_size=2)
    loader = acc.prepare(DataLoader(hf, batch_size=2))
    out["hf"], out["hf_warn"] = _caught(lambda: _pass_dict(acc, loader))
    pipeline = wds.DataPipeline(wds.SimpleShardList(_wds_shards(root / "wds")),
                                wds.split_by_node, wds.tarfile_to_samples(),
                                wds.map(lambda sample: int(sample["cls"])))
    out["wds"], out["wds_warn"] = _caught(
        lambda: _pass(acc, acc.prepare(DataLoader(pipeline, batch_size=2))))


def _pass_dict(acc: Any, loader: Any) -> tuple[list[int], list[int], list[int]]:
    mine: list[int] = []
    gathered: list[int] = []
    reals: list[int] = []
    for batch in loader:
        mine += batch["x"].tolist()
        reals.append(loader.current_real_len)
        gathered += acc.gather_for_metrics(batch["x"]).tolist()
    return mine, reals, gathered


def _resume(rank: int, root: Path, out: dict[str, Any]) -> None:
    """save_state in the middle of a rank-local pass; load_state resumes with the next batch."""
    acc = _accelerator(use_stateful_dataloader=True, already_sharded=True)
    own = [rank * 100 + i for i in range(7 + 2 * rank)]  # 4 and 5 batches: rank 0 pads once
    loader = acc.prepare(DataLoader(Own(own), batch_size=2))
    seen: list[int] = []
    for i, batch in enumerate(loader):
        seen += batch.tolist()
        if i == 1:
            acc.save_state(str(root / "ckpt"))
    acc.load_state(str(root / "ckpt"))
    out["resume_full"] = seen
    out["resume_rest"] = [x for batch in loader for x in batch.tolist()]
    acc.end_training()


def _errors(rank: int, acc: Any, out: dict[str, Any]) -> None:
    from accel.config import DataLoaderConfiguration

    acc.dataloader_config = DataLoaderConfiguration(already_sharded=True)
    try:
        acc.prepare(DataLoader(list(range(8)), batch_size=2))
    except ValueError as err:
        out["map_error"] = str(err)
    acc.dataloader_config = DataLoaderConfiguration(already_sharded=rank == 0)
    try:
        acc.prepare(DataLoader(Own([1, 2]), batch_size=2))
    except ValueError as err:
        out["disagree_error"] = str(err)


def _worker(rank: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    acc = _basic(rank, out)
    _flagged(rank, acc, out)
    _recognised(rank, acc, Path(root), out)
    _errors(rank, acc, out)
    acc.end_training()
    _resume(rank, Path(root), out)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("rank_local")
    return run_workers(_worker, 2, args=(str(root),), timeout=240)


def test_a_rank_local_stream_is_not_cut_again(results: list[dict[str, Any]]) -> None:
    """The issue's case: each rank's dataset yields 8 items of its own; before the fix each
    rank's prepared loader yielded 4 of them, with no warning."""
    for rank, out in enumerate(results):
        mine, reals, gathered = out["issue"]
        assert mine == [rank * 100 + i for i in range(8)]
        assert reals == [2, 2, 2, 2]
        assert sorted(gathered) == sorted(list(range(8)) + [100 + i for i in range(8)])
    assert len(results[0]["issue_warn"]) == 1  # once, on the main process, naming the flag
    assert "first batches differ" in results[0]["issue_warn"][0]
    assert results[1]["issue_warn"] == []


def test_streams_whose_lengths_differ_are_found_at_prepare(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        assert out["len_by_length"] == 5  # the longest rank's steps (9 items, batch 2)
        mine, reals, gathered = out["by_length"]
        own = [rank * 100 + i for i in range(5 + 4 * rank)]
        assert mine[: len(own)] == own
        assert sum(reals) == len(own) and len(reals) == 5
        assert sorted(gathered) == sorted(list(range(5)) + [100 + i for i in range(9)])
    assert len(results[0]["by_length_warn"]) == 1
    assert "length differs across ranks" in results[0]["by_length_warn"][0]
    assert results[1]["by_length_warn"] == []


def test_a_global_stream_is_still_split(results: list[dict[str, Any]]) -> None:
    assert results[0]["global"][0] == [0, 1, 4, 5]
    assert results[1]["global"][0] == [2, 3, 6, 7]
    assert results[0]["global"][2] == list(range(8))
    assert results[0]["global_warn"] == results[1]["global_warn"] == []


def test_already_sharded_keeps_unequal_streams_whole_and_in_step(
        results: list[dict[str, Any]]) -> None:
    expected = sorted(list(range(5)) + [100 + i for i in range(9)])
    for rank, out in enumerate(results):
        mine, reals, gathered = out["uneven"]
        assert out["uneven_warn"] == []  # the flag says it: no detection warning
        assert len(reals) == 5  # rank 0 (3 batches) pads twice with its last batch
        assert reals == ([2, 2, 1, 0, 0] if rank == 0 else [2, 2, 2, 2, 1])
        assert sorted(gathered) == expected
        if rank == 0:
            assert mine == [0, 1, 2, 3, 4, 4, 4]  # real: 0..4; then copies of [4] (padding)
        assert out["ddp_steps"] == 5


def test_a_rank_with_an_empty_stream_pads_with_another_ranks_batch(
        results: list[dict[str, Any]]) -> None:
    for out in results:
        mine, reals, gathered = out["empty"]
        assert sorted(gathered) == [100, 101, 102]
        assert len(reals) == 2
    assert results[0]["empty"][1] == [0, 0]
    assert results[0]["empty"][0] == [100, 101, 100, 101]  # rank 1's first batch, as padding


def test_known_pre_split_sources_are_recognised(results: list[dict[str, Any]]) -> None:
    hf = [x for out in results for x in out["hf"][0][: sum(out["hf"][1])]]
    assert sorted(hf) == list(range(9))
    assert sorted(results[0]["hf"][2]) == list(range(9))
    wds_all = sorted(shard * 10 + i for shard in range(4) for i in range(3))
    assert sorted(results[0]["wds"][2]) == wds_all
    assert sorted(x for out in results for x in out["wds"][0]) == wds_all
    for out in results:
        assert out["hf_warn"] == [] and out["wds_warn"] == []


def test_a_rank_local_loader_resumes_exactly(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        own = [rank * 100 + i for i in range(7 + 2 * rank)]
        assert out["resume_full"][: len(own)] == own
        assert out["resume_rest"] == out["resume_full"][4:]  # after 2 batches of 2


def test_bad_input_gets_a_clear_error(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert "already_sharded=True) is for iterable datasets" in out["map_error"]
        assert "map-style" in out["map_error"]
        assert "already_sharded" in out["disagree_error"]
        assert "rank 0" in out["disagree_error"] and "rank 1" in out["disagree_error"]
