"""accel.data.local: the plan that keeps rank-local streams whole and in step (issue 26).

The exchange between ranks is simulated with one thread per rank and a barrier, so that many
stream lengths (empty ones included) are checked in one process; the real collective is
tested in tests/distributed/test_rank_local_data.py.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import torch

from accel.data.local import WINDOW, fingerprint, local_steps, presplit_source


class _Exchange:
    """An all-gather of small integer lists among ``world`` threads."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[Any] = [None] * world
        self.calls = [0] * world

    def for_rank(self, rank: int) -> Any:
        def exchange(values: list[int]) -> list[list[int]]:
            self.calls[rank] += 1
            self.slots[rank] = list(values)
            self.barrier.wait()
            everyone = [list(v) for v in self.slots]
            self.barrier.wait()
            return everyone

        def share(obj: Any, src: int) -> Any:
            if rank == src:
                self.slots[src] = obj
            self.barrier.wait()
            value = self.slots[src]
            self.barrier.wait()
            return value

        return exchange, share


def _run(lengths: list[int], skip: int = 0) -> list[list[tuple[Any, int, int, bool]]]:
    """Every rank's (batch, size, real, last) steps for streams of ``lengths`` chunks."""
    world = len(lengths)
    net = _Exchange(world)
    out: list[Any] = [None] * world
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        exchange, share = net.for_rank(rank)
        chunks = iter([((rank, i), 2) for i in range(lengths[rank])])
        try:
            out[rank] = [(b, s.size, s.real, s.last) for b, s in
                         local_steps(chunks, exchange=exchange, share=share, skip=skip,
                                     rank=rank)]
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread)
            errors.append(exc)
            net.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("seed", range(40))
def test_every_rank_takes_the_longest_streams_steps_and_every_chunk_once(seed: int) -> None:
    rng = random.Random(seed)
    world = rng.randint(2, 4)
    lengths = [rng.choice([0, 1, WINDOW, WINDOW + 1, rng.randint(0, 3 * WINDOW + 2)])
               for _ in range(world)]
    out = _run(lengths)
    longest = max(lengths)
    for rank, steps in enumerate(out):
        assert len(steps) == longest
        real = [batch for batch, _, real, _ in steps if real]
        assert real == [(rank, i) for i in range(lengths[rank])]  # whole, in order, once
        assert [last for *_, last in steps] == [i == longest - 1 for i in range(longest)]
        padding = [batch for batch, _, real, _ in steps if not real]
        assert len(padding) == longest - lengths[rank]
        if padding and lengths[rank]:  # a copy of this rank's own last batch
            assert set(padding) == {(rank, lengths[rank] - 1)}
        elif padding:  # an empty stream pads with the first batch of the lowest rank with data
            source = next(r for r, n in enumerate(lengths) if n)
            assert set(padding) == {(source, 0)}


def test_one_exchange_per_window_of_steps() -> None:
    net_calls = _count_exchanges([3 * WINDOW, 3 * WINDOW])
    assert net_calls == [3, 3]  # one per WINDOW steps (the last one also finds the end)


def _count_exchanges(lengths: list[int]) -> list[int]:
    world = len(lengths)
    net = _Exchange(world)

    def rank_main(rank: int) -> None:
        exchange, share = net.for_rank(rank)
        chunks = iter([(i, 1) for i in range(lengths[rank])])
        list(local_steps(chunks, exchange=exchange, share=share, skip=0, rank=rank))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return net.calls


def test_skip_leaves_out_the_first_steps_of_the_same_plan() -> None:
    full = _run([3, 7])
    resumed = _run([3, 7], skip=4)
    assert resumed == [steps[4:] for steps in full]


def test_alone_the_stream_is_yielded_as_it_is() -> None:
    steps = list(local_steps(iter([("a", 2), ("b", 1)]), exchange=None, share=None, skip=0))
    assert [(b, s.real, s.last) for b, s in steps] == [("a", 2, False), ("b", 1, True)]
    assert list(local_steps(iter([]), exchange=None, share=None, skip=0)) == []


def test_padding_is_a_copy_the_user_cannot_change_through_a_yielded_batch() -> None:
    net = _Exchange(2)
    got: list[Any] = [None, None]

    def rank_main(rank: int) -> None:
        exchange, share = net.for_rank(rank)
        chunks = iter([(torch.tensor([float(rank * 10 + i)]), 1) for i in range(1 + 2 * rank)])
        values = []
        for batch, _ in local_steps(chunks, exchange=exchange, share=share, skip=0, rank=rank):
            values.append(float(batch))
            batch.mul_(100)  # in place, as training code may do
        got[rank] = values

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert got == [[0.0, 0.0, 0.0], [10.0, 11.0, 12.0]]


def test_fingerprints_tell_streams_apart_cheaply() -> None:
    a = [{"x": torch.arange(6).reshape(2, 3), "text": ["a", "b"]}]
    assert fingerprint(a) == fingerprint([{"x": torch.arange(6).reshape(2, 3),
                                           "text": ["a", "b"]}])
    assert fingerprint(a) != fingerprint([{"x": torch.arange(6).reshape(3, 2),
                                           "text": ["a", "b"]}])
    assert fingerprint(a) != fingerprint([{"x": torch.arange(6).reshape(2, 3),
                                           "text": ["a", "c"]}])
    assert fingerprint([torch.zeros(2)]) != fingerprint([torch.zeros(2, dtype=torch.float64)])
    big = torch.zeros(1 << 20)
    other = big.clone()
    other[-1] = 1.0  # the sampled tail tells them apart
    assert fingerprint([big]) != fingerprint([other])
    assert fingerprint([torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(True)]) == \
        fingerprint([torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(True)])


def test_known_pre_split_sources() -> None:
    class StreamingDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(())

    StreamingDataset.__module__ = "streaming.base.dataset"
    assert presplit_source(StreamingDataset()) == "streaming.StreamingDataset"

    class Sub(StreamingDataset):
        pass

    Sub.__module__ = "mypackage"
    assert presplit_source(Sub()) == "streaming.StreamingDataset"

    class Plain(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(())

    assert presplit_source(Plain()) is None
    assert presplit_source([1, 2]) is None
