"""Rank-local streams: data that each rank already reads for itself is never cut again.

A user may split a stream by rank before accel sees it (per-rank file lists, webdataset's
``split_by_node``, a Hugging Face dataset ``split_dataset_by_node``, a generator that reads
``RANK``). Cutting it again would drop ``(world - 1) / world`` of the data without a sound, so such
a stream is yielded whole on its rank. Two things still have to hold across ranks:

* **Equal step counts.** Streams of different lengths would leave a rank waiting in a collective
  (DDP's gradient all-reduce, ``gather_for_metrics``) that the others never reach. The ranks read
  ahead a small window of batches and agree, with one small all-gather per window, on how many
  steps everyone can still take; a rank whose stream ended first repeats a copy of its last batch
  (marked as not real: ``gather_for_metrics`` drops it), as ``even_batches`` pads a map-style
  epoch. A rank whose stream was empty from the start pads with another rank's first batch.
* **Detection.** Without ``DataLoaderConfiguration(already_sharded=True)`` or a recognised
  pre-split source, a stream counts as global (every rank reads the same items) unless the ranks'
  first batches differ: ``fingerprint`` hashes them cheaply (dtype, shape and a sample of the
  bytes of every tensor; ``repr`` of other leaves) and the ranks compare the hashes once.

Example:
    >>> chunks = iter([("a", 2), ("b", 2), ("c", 1)])
    >>> steps = local_steps(chunks, exchange=None, share=None, skip=0)
    >>> [(batch, step.real, step.last) for batch, step in steps]
    [('a', 2, False), ('b', 2, False), ('c', 1, True)]
"""

from __future__ import annotations

import hashlib
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from .._base.warn import warn_user
from .iterable import clone_batch
from .plan import Step

__all__ = ["WINDOW", "Exchange", "RankLocal", "Share", "fingerprint", "local_steps",
           "presplit_source"]

#: Batches a rank reads ahead of the one it yields, so the ranks agree on their remaining steps
#: once per ``WINDOW`` steps (one all-gather of two integers) rather than at every batch.
WINDOW = 4

#: ``exchange(values) -> every rank's values, in rank order`` (an all-gather of small integers).
Exchange = Callable[[list[int]], list[list[int]]]
#: ``share(obj, src) -> src's obj`` on every rank (a broadcast of a Python object).
Share = Callable[[Any, int], Any]

#: Bytes of each tensor that go into a fingerprint: its first and its last ``_SAMPLE`` bytes.
_SAMPLE = 64 * 1024

#: (top-level module, class name) of IterableDatasets that split their stream by rank themselves
#: (MosaicML streaming and Lightning's litdata read the rank from the environment).
_SELF_SPLITTING = (("streaming", "StreamingDataset"), ("litdata", "StreamingDataset"))


def presplit_source(dataset: Any) -> str | None:
    """What splits ``dataset`` by rank already, when it is a source known to (else ``None``).

    Recognised: a Hugging Face ``datasets`` stream from ``split_dataset_by_node``, a webdataset
    pipeline with a ``split_by_node`` stage, MosaicML's and litdata's ``StreamingDataset``.
    """
    if getattr(dataset, "_distributed", None) is not None:
        return "datasets.distributed.split_dataset_by_node"
    for stage in getattr(dataset, "pipeline", None) or ():
        name = getattr(stage, "__name__", "")
        if name == "split_by_node" and str(getattr(stage, "__module__", "")).startswith(
                "webdataset"):
            return "webdataset.split_by_node"
    for cls in type(dataset).__mro__:
        top = cls.__module__.split(".")[0]
        if (top, cls.__name__) in _SELF_SPLITTING:
            return f"{top}.{cls.__name__}"
    return None


def fingerprint(batches: Iterable[Any]) -> int:
    """A signed 64-bit hash of ``batches`` (their structure, shapes, dtypes, sampled bytes)."""
    digest = hashlib.blake2b(digest_size=8)
    for batch in batches:
        _feed(digest, batch)
        digest.update(b"|")
    return int.from_bytes(digest.digest(), "little", signed=True)


def _feed(digest: Any, data: Any) -> None:
    if isinstance(data, torch.Tensor):
        digest.update(f"T{data.dtype}{tuple(data.shape)}".encode())
        raw = data.detach().reshape(-1).contiguous().cpu().view(torch.uint8)
        if raw.numel() > 2 * _SAMPLE:
            raw = torch.cat([raw[:_SAMPLE], raw[-_SAMPLE:]])
        digest.update(raw.numpy().tobytes())
    elif isinstance(data, Mapping):
        for key, value in data.items():
            digest.update(f"K{key!r}".encode())
            _feed(digest, value)
    elif isinstance(data, (list, tuple)):
        digest.update(f"L{len(data)}".encode())
        for item in data:
            _feed(digest, item)
    else:
        digest.update(f"V{data!r}".encode())


class _Reader:
    """This rank's stream, read ahead by up to ``WINDOW + 1`` chunks."""

    def __init__(self, chunks: Iterator[tuple[Any, int]]) -> None:
        self.chunks = chunks
        self.buffer: deque[tuple[Any, int]] = deque()
        self.ended = False
        self.pad: tuple[Any, int] | None = None  # what this rank repeats once its stream ended

    def fill(self) -> None:
        while not self.ended and len(self.buffer) < WINDOW + 1:
            item = next(self.chunks, None)
            if item is None:
                self.ended = True
            else:
                self.buffer.append(item)

    def take(self) -> tuple[Any, int, int]:
        """(batch, samples, real samples) of this rank's next step."""
        if self.buffer:
            batch, count = self.buffer.popleft()
            return batch, int(count), int(count)
        if self.pad is None:
            raise RuntimeError("internal error: a rank-local stream ran out before its last step")
        return self.pad[0], int(self.pad[1]), 0


def local_steps(chunks: Iterator[tuple[Any, int]], *, exchange: Exchange | None,
                share: Share | None, skip: int, rank: int = 0) -> Iterator[tuple[Any, Step]]:
    """``(batch, step)`` of a rank-local stream of ``(batch, samples)`` chunks.

    With ``exchange`` (several ranks) every rank yields the same number of steps: the longest
    stream's; without it (one rank, or a shard built in a process alone) the stream as it is.
    The first ``skip`` steps are read but not yielded (resume).
    """
    reader = _Reader(chunks)
    index = 0
    while True:
        reader.fill()
        if exchange is None:
            steps, final = _alone(reader)
        else:
            steps, final = _agree(reader,
                                  everyone=exchange([len(reader.buffer), int(reader.ended)]),
                                  share=share, first=index == 0, rank=rank)
        for k in range(steps):
            batch, size, real = reader.take()
            if index >= skip:
                yield batch, Step(batch, size, real, final and k == steps - 1)
            index += 1
        if final:
            return


def _alone(reader: _Reader) -> tuple[int, bool]:
    if reader.ended:
        return len(reader.buffer), True
    return len(reader.buffer) - 1, False  # keep one read ahead: it tells whether a step is last


def _agree(reader: _Reader, *, everyone: list[list[int]], share: Share | None,
           first: bool, rank: int) -> tuple[int, bool]:
    """(steps every rank takes now, whether they end the pass) from every rank's
    ``[chunks read ahead, stream ended]``; prepares this rank's padding when it will need it."""
    counts = [int(c) for c, _ in everyone]
    ended = [bool(e) for _, e in everyone]
    if all(ended):
        steps, final = max(counts), True
    else:  # every rank still reading keeps one chunk back, to know whether a step is last
        steps, final = min(c for c, e in zip(counts, ended, strict=True) if not e) - 1, False
    mine = len(reader.buffer)
    if first and steps and 0 in counts and share is not None:
        # A rank whose stream is empty pads with the first batch of the lowest rank with data
        # (every rank knows this from the counts, so every rank takes part in the broadcast).
        source = next(r for r, c in enumerate(counts) if c)
        lent = share(reader.buffer[0] if rank == source else None, source)
        if not mine:
            reader.pad = (lent[0], int(lent[1]))
    drained = steps > mine or (steps == mine and not final)  # steps may follow this rank's last
    if reader.ended and drained and reader.pad is None and mine:
        last, count = reader.buffer[-1]  # the user may change a batch in place: repeat a copy
        reader.pad = (clone_batch(last), int(count))
    return steps, final


class RankLocal:
    """Whether an iterable loader's stream is rank-local, and how its ranks agree.

    ``known``: it is rank-local (``already_sharded=True``, a recognised source); otherwise it
    is global unless the ranks' streams differ, decided by ``decide`` (lengths, at
    ``prepare()``) or ``detect`` (first batches, at the first pass) and then kept.
    ``exchange``/``share`` are ``None`` when this process cannot talk to the other ranks (one
    process, or a shard built for another rank in a process alone).
    """

    def __init__(self, *, known: bool, rank: int, world: int, even: bool,
                 exchange: Exchange | None, share: Share | None) -> None:
        self.rank_local = known
        self.decided = known or exchange is None  # nothing to detect alone
        self.rank, self.world, self.even = rank, world, even
        self.exchange, self.share = exchange, share
        self.steps_per_pass: int | None = None  # the longest rank's batches, when lengths are known
        self._warned_even = False

    def decide(self, batches: list[int | None]) -> None:
        """Every rank's batches per pass (``None``: no ``len``), gathered at ``prepare()``:
        iterable datasets whose lengths differ across ranks are rank-local."""
        known = [b for b in batches if b is not None]
        if len(known) == len(batches) and known:
            self.steps_per_pass = max(known)
            if not self.decided and len(set(known)) > 1:
                self._found(f"its dataset's length differs across ranks ({batches} batches)")

    def detect(self, chunks: Iterator[tuple[Any, int]]) -> Iterator[tuple[Any, int]]:
        """``chunks`` unchanged, after the ranks compared the fingerprints of their first
        ``world`` chunks (once per loader: the first pass decides)."""
        if self.decided or self.exchange is None:  # (the second: for the type checker)
            return chunks
        head = [item for _, item in zip(range(self.world), chunks, strict=False)]
        mine = [fingerprint(batch for batch, _ in head), len(head)]
        everyone = self.exchange(mine)
        self.decided = True
        if any(list(other) != mine for other in everyone):
            self._found("its first batches differ across ranks")
        return itertools.chain(head, chunks)

    def steps(self, chunks: Iterator[tuple[Any, int]], *, skip: int
              ) -> Iterator[tuple[Any, Step]]:
        for batch, step in local_steps(chunks, exchange=self.exchange, share=self.share,
                                       skip=skip, rank=self.rank):
            if step.real == 0 and not self.even and not self._warned_even:
                self._warned_even = True
                warn_user(
                    f"even_batches=False does not apply to a rank-local stream: rank {self.rank}'s "
                    "stream ended before another rank's, and no rank knows in advance when the "
                    "others' end, so it repeats its last batch (marked as padding: "
                    "gather_for_metrics drops it) until the longest stream ends; this keeps "
                    "every collective matched")
            yield batch, step

    def _found(self, why: str) -> None:
        """Rank-local after all: say so once, on the main process, at the user's line."""
        self.rank_local = True
        if self.rank == 0:
            warn_user(
                f"the iterable dataset of a prepared DataLoader reads a different stream on each "
                f"rank ({why}): it is taken as already split by rank, and each rank keeps all of "
                "its stream (cutting it again would lose data). Pass DataLoaderConfiguration("
                "already_sharded=True) to say so and silence this warning; if every rank should "
                "read the same stream, make its order the same on every rank (seed its shuffle "
                "identically) so that prepare() splits it")
