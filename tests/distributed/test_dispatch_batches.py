"""``DataLoaderConfiguration(dispatch_batches=True)``: rank 0 reads, every rank gets its share.

One 2-process spawn checks: a stream only rank 0 can read (the other rank's dataset raises if
iterated); batches whose shapes change from one to the next (each batch of a sequence
length of its own) and nested structures; shuffled map-style data read once in rank 0's order,
each sample once per pass (plus marked padding) and ``gather_for_metrics`` exact for lengths that
do not fill the last round, with and without ``even_batches`` and with ``split_batches``; training
steps in lockstep (DDP); exact resume through ``save_state``/``load_state``; the errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.spawn import run_workers


class RankZeroOnly(IterableDataset):
    """A stream only rank 0 can read (a queue, a cursor): iterating it elsewhere fails."""

    def __init__(self, rank: int, n: int) -> None:
        self.rank, self.n = rank, n

    def __iter__(self) -> Any:
        if self.rank != 0:
            raise RuntimeError("only rank 0 can read this stream")
        for i in range(self.n):
            # a sequence of its own length per sample: collated batches change shape
            yield {"x": torch.full((1 + i % 3,), float(i)), "id": i}

    def __len__(self) -> int:
        return self.n


def _collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    width = max(len(item["x"]) for item in items)
    x = torch.stack([torch.nn.functional.pad(item["x"], (0, width - len(item["x"])))
                     for item in items])
    return {"x": x, "id": torch.tensor([item["id"] for item in items]),
            "meta": {"width": width}}


def _accelerator(**config: Any) -> Any:
    from accel import Accelerator
    from accel.config import DataLoaderConfiguration

    return Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
        dispatch_batches=True, **config))


def _pass(acc: Any, loader: Any) -> dict[str, Any]:
    mine: list[int] = []
    widths: list[int] = []
    gathered: list[int] = []
    for batch in loader:
        ids = batch["id"] if isinstance(batch, dict) else batch
        mine += ids.tolist()
        if isinstance(batch, dict):
            widths.append(int(batch["x"].shape[1]))
            assert batch["meta"]["width"] == batch["x"].shape[1]
        gathered += acc.gather_for_metrics(ids).tolist()
    return {"mine": mine, "widths": widths, "gathered": gathered, "len": len(loader)}


def _streams(rank: int, out: dict[str, Any]) -> None:
    acc = _accelerator()
    out["flag"] = acc.dispatch_batches
    loader = acc.prepare(DataLoader(RankZeroOnly(rank, 11), batch_size=2, collate_fn=_collate))
    out["stream"] = _pass(acc, loader)
    out["stream_again"] = _pass(acc, loader)  # a second pass reads rank 0's stream again
    acc.end_training()
    uneven = _accelerator(even_batches=False)
    out["uneven"] = _pass(uneven, uneven.prepare(DataLoader(list(range(7)), batch_size=2)))
    uneven.end_training()
    split = _accelerator(split_batches=True)
    out["split"] = _pass(split, split.prepare(DataLoader(list(range(10)), batch_size=4)))
    split.end_training()


def _shuffled(rank: int, out: dict[str, Any]) -> None:
    from accel.utils import set_seed

    set_seed(0)
    acc = _accelerator()
    loader = acc.prepare(DataLoader(list(range(9)), batch_size=2, shuffle=True))
    out["shuffled"] = [_pass(acc, loader) for _ in range(2)]  # two epochs
    acc.end_training()


def _train(rank: int, out: dict[str, Any]) -> None:
    """DDP steps on dispatched batches stay in lockstep and agree with one process's."""
    torch.manual_seed(0)
    acc = _accelerator()
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [torch.tensor([float(i)]) for i in range(8)]
    model, opt, loader = acc.prepare(model, opt, DataLoader(data, batch_size=2))
    for batch in loader:
        loss = (model(batch) ** 2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    out["weight"] = acc.unwrap_model(model).weight.item()
    acc.end_training()


def _resume(rank: int, root: Path, out: dict[str, Any]) -> None:
    acc = _accelerator(use_stateful_dataloader=True)
    loader = acc.prepare(DataLoader(RankZeroOnly(rank, 12), batch_size=2, collate_fn=_collate))
    seen: list[int] = []
    for i, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if i == 0:
            acc.save_state(str(root / "ckpt"))
    acc.load_state(str(root / "ckpt"))
    out["resume_full"] = seen
    out["resume_rest"] = [x for batch in loader for x in batch["id"].tolist()]
    acc.end_training()


def _errors(rank: int, out: dict[str, Any]) -> None:
    from torch.utils.data import DistributedSampler

    acc = _accelerator()
    data = list(range(8))
    try:
        acc.prepare(DataLoader(data, batch_size=2,
                               sampler=DistributedSampler(data, num_replicas=2, rank=rank)))
    except ValueError as err:
        out["sampler_error"] = str(err)
    acc.end_training()


def _worker(rank: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _streams(rank, out)
    _shuffled(rank, out)
    _train(rank, out)
    _resume(rank, Path(root), out)
    _errors(rank, out)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("dispatch")
    return run_workers(_worker, 2, args=(str(root),), timeout=240)


def test_rank_zero_reads_and_every_rank_gets_its_share(results: list[dict[str, Any]]) -> None:
    assert [out["flag"] for out in results] == [True, True]
    # 11 samples, batch 2 per rank: chunks [0,1] [2,3] | [4,5] [6,7] | [8,9] [10]: rank 0 takes
    # the even chunks, rank 1 the odd ones; every sample once, in order, when gathered.
    assert results[0]["stream"]["mine"] == [0, 1, 4, 5, 8, 9]
    assert results[1]["stream"]["mine"] == [2, 3, 6, 7, 10]
    for out in results:
        assert out["stream"]["gathered"] == list(range(11))
        assert out["stream"]["len"] == 3
        assert out["stream_again"] == out["stream"]


def test_batches_may_change_shape(results: list[dict[str, Any]]) -> None:
    # sample i has length 1 + i % 3; a batch is as wide as its longest sample:
    # rank 0: (0, 1) -> 2, (4, 5) -> 3, (8, 9) -> 3; rank 1: (2, 3) -> 3, (6, 7) -> 2, (10) -> 2
    assert results[0]["stream"]["widths"] == [2, 3, 3]
    assert results[1]["stream"]["widths"] == [3, 2, 2]


def test_uneven_and_split_batches(results: list[dict[str, Any]]) -> None:
    # even_batches=False: 7 samples, chunks [0,1] [2,3] | [4,5] [6]: no padding
    assert [out["uneven"]["mine"] for out in results] == [[0, 1, 4, 5], [2, 3, 6]]
    assert all(out["uneven"]["gathered"] == list(range(7)) for out in results)
    # split_batches: each batch of 4 is cut in pieces of 2; the last batch (8, 9) is one piece,
    # so rank 1 repeats its first piece, marked as padding (as for a stream every rank reads)
    assert [out["split"]["mine"] for out in results] == [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 2, 3]]
    assert all(out["split"]["gathered"] == list(range(10)) for out in results)


def test_shuffled_map_style_data_is_read_once_in_rank_zeros_order(
        results: list[dict[str, Any]]) -> None:
    first, second = results[0]["shuffled"]
    assert results[1]["shuffled"][0]["gathered"] == first["gathered"]
    for epoch in (first, second):
        assert sorted(epoch["gathered"]) == list(range(9))
    assert first["gathered"] != list(range(9))  # shuffled
    assert first["gathered"] != second["gathered"]  # a new order each epoch
    both = results[0]["shuffled"][0]["mine"] + results[1]["shuffled"][0]["mine"]
    # 5 chunks of 2, 2, 2, 2, 1 samples: rank 1 repeats its first chunk in the last round
    assert len(both) == 11 and sorted(set(both)) == list(range(9))


def test_training_steps_stay_in_lockstep(results: list[dict[str, Any]]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for start in (0, 4):  # one process, the global batch of each step (2 ranks x 2)
        batch = torch.tensor([[float(i)] for i in range(start, start + 4)])
        (model(batch) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    for out in results:
        assert out["weight"] == pytest.approx(model.weight.item(), rel=1e-6)


def test_resume_continues_with_the_next_batch(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        full = out["resume_full"]
        assert out["resume_rest"] == full[2:]  # saved after the first batch
    assert results[0]["resume_full"] == [0, 1, 4, 5, 8, 9]


def test_errors_name_the_conflict(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert "already split by rank (a DistributedSampler); drop one" in out["sampler_error"]
