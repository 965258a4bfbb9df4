"""Prepared data loaders: sharded by rank, placed on the device, tracked, resumable.

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> from accel.config import DataLoaderConfiguration
    >>> from accel.distributed import Communicator, ProcessContext
    >>> ctx = ProcessContext.single()
    >>> tracker = DataTracker()
    >>> loader = build_prepared_loader(DataLoader(range(5), batch_size=2), ctx=ctx,
    ...     comm=Communicator(ctx), device=None, config=DataLoaderConfiguration(),
    ...     tracker=tracker, seed=0)
    >>> [(b.tolist(), loader.end_of_dataloader) for b in loader]
    [([0, 1], False), ([2, 3], False), ([4], True)]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from .._base.warn import warn_user
from ..config.settings import DataLoaderConfiguration
from ..distributed.context import ProcessContext
from ..distributed.ops import Communicator
from .plan import Step
from .samplers import SkipBatchSampler
from .selection import check_same_everywhere, dataset_length, select_source
from .sources import _Source, rebuild_loader
from .stateful import stateful_variant
from .transfer import send_to_device
from .trim import trim_batch

__all__ = ["DataTracker", "PreparedDataLoader", "build_prepared_loader", "override_even_batches",
           "skip_first_batches"]

#: 3: adds "generator" (use_seedable_sampler=False: the sampler generator's state at the start
#: of the pass the position is in); 2: shuffled as Accelerate's SeedableRandomSampler (epoch e
#: from seed + e); 1 (accel before that) mixed seed and epoch otherwise: its positions load, its
#: mid-epoch shuffle order is gone.
_STATE_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)


class DataTracker:
    """Which prepared loader is being iterated (innermost first) for one ``Accelerator``.

    Also caches the subgroups used for the last gather of an uneven epoch (every rank creates
    the same ones in the same order, so the caches stay identical across ranks). With
    ``groups=False`` none is created (a loader no ``Accelerator`` gathers for, or a shard built
    for another rank in this process alone).
    """

    def __init__(self, groups: bool = True) -> None:
        self._stack: list[tuple[object, PreparedDataLoader]] = []
        self._groups: dict[tuple[int, ...], Any] = {}
        self._make_groups = groups

    def __getstate__(self) -> dict[str, Any]:
        # Process groups belong to this process and what is being iterated to this moment: a
        # copy (pickled into a DataLoader worker, say) starts with neither.
        return {"_stack": [], "_groups": {}, "_make_groups": self._make_groups}

    @property
    def active(self) -> PreparedDataLoader | None:
        """The innermost loader currently being iterated, or ``None``."""
        return self._stack[-1][1] if self._stack else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self._stack)

    @property
    def end_of_dataloader(self) -> bool:
        """True while the batch just yielded by the active loader is its last."""
        active = self.active
        return active is not None and active.end_of_dataloader

    def push(self, loader: PreparedDataLoader) -> object:
        token = object()
        self._stack.append((token, loader))
        return token

    def pop(self, token: object) -> None:
        self._stack = [entry for entry in self._stack if entry[0] is not token]

    def subgroup(self, ranks: tuple[int, ...]) -> Any:
        """The process group of ``ranks``; created on first use, by every rank at once."""
        if not self._make_groups:
            return None
        if ranks not in self._groups:
            self._groups[ranks] = dist.new_group(list(ranks))
        return self._groups[ranks]

    def group(self, ranks: tuple[int, ...]) -> Any:
        """The already created process group of ``ranks`` (never creates one: only some ranks
        ask for it, and creating a group needs every rank)."""
        if not self._make_groups:
            return None
        if ranks not in self._groups:
            raise RuntimeError(f"internal error: no process group was announced for ranks "
                               f"{list(ranks)} before their last batch")
        return self._groups[ranks]


class PreparedDataLoader:
    """A data loader sharded by rank whose batches arrive on the device.

    ``len()`` is the number of batches this rank yields per epoch. Each new ``for`` loop is a
    new epoch (with ``use_seedable_sampler=True`` its shuffle order depends only on the seed
    and the epoch) unless ``set_epoch`` or ``load_state_dict`` said otherwise.
    See ``accel.data`` for the sharding rules.

    With ``use_seedable_sampler=False`` (the default) a shuffling sampler keeps its own
    generator, as in Accelerate: every pass starts by copying rank 0's generator state to all
    ranks, and its order is the sampler's next draw from it.

    ``state_dict()`` always gives the position (``save_state`` stores it). ``load_state_dict``
    restores it exactly: the next pass continues with the next unseen batch. ``load_state``
    calls it only with ``DataLoaderConfiguration(use_stateful_dataloader=True)``; otherwise the
    loader is left as it is, as Accelerate leaves its loaders, for scripts that skip batches
    by hand after ``load_state``. With that switch and torchdata installed, the loader is an
    instance of a subclass that is also torchdata's ``StatefulDataLoader`` (``accel.data.stateful``;
    everything above stays as described).
    """

    def __init__(self, base: DataLoader[Any], source: _Source, *, ctx: ProcessContext,
                 device: torch.device | None, config: DataLoaderConfiguration,
                 tracker: DataTracker, seed: int,
                 after_batch: Callable[[], None] | None = None,
                 sync: Callable[[torch.Tensor], Any] | None = None) -> None:
        self.base_dataloader = base
        self.dataset = base.dataset
        self.device = device
        self.batch_size = source.batch_size
        self.total_batch_size = source.total_batch_size
        self.total_dataset_length = dataset_length(base.dataset)
        self.epoch = 0
        self.end_of_dataloader = False
        self.current_batch_len = 0
        self.current_real_len = 0
        self.metrics_group: Any = None
        self._source = source
        self._ctx = ctx
        self._config = config
        self._tracker = tracker
        self._seed = int(seed)
        self._after_batch = after_batch
        self._started = False
        self._passes = 0
        self._yielded = 0
        self._next: tuple[int, int] | None = None
        self._next_loaded = False
        self._sync = sync  # copies rank 0's tensor into this rank's (None: one process)
        self._pass_state: torch.Tensor | None = None  # the pass generator's state at its start
        self._restored_state: torch.Tensor | None = None  # ... for the next pass, from a state

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return self._iterate(None)

    def _iterate(self, requested_skip: int | None) -> Iterator[Any]:
        epoch, skip = self._begin_pass(requested_skip)
        token = self._tracker.push(self)
        try:
            for batch, step in self._source.steps(epoch, skip):
                for ranks in step.announce:
                    self._tracker.subgroup(ranks)
                if step.payload is None:
                    continue
                self._take(step)
                if self._after_batch is not None:
                    self._after_batch()  # the device's per-batch hook (XLA: mark_step)
                yield send_to_device(batch, self.device, non_blocking=self._config.non_blocking)
        finally:
            self._tracker.pop(token)
            self._passes -= 1
            self.end_of_dataloader = False
            self.metrics_group = None

    def _take(self, step: Step) -> None:
        self.current_batch_len = step.size
        self.current_real_len = step.real
        self.end_of_dataloader = step.last
        self.metrics_group = self._tracker.group(step.active) if step.active else None
        self._yielded += 1

    def _begin_pass(self, requested_skip: int | None) -> tuple[int, int]:
        saved, loaded = self._next, self._next_loaded
        if saved is not None:
            epoch, skip = self._upcoming(saved)
        else:
            epoch, skip = (self.epoch + 1 if self._started else self.epoch), 0
        if requested_skip is not None:
            if loaded and requested_skip != skip:
                warn_user(
                    f"skip_first_batches({requested_skip}) after load_state restored the "
                    f"position after batch {skip} of epoch {epoch} "
                    "(use_stateful_dataloader=True): this pass starts after batch "
                    f"{requested_skip} of that epoch, as asked. The loader resumes by itself; "
                    "iterate it without skip_first_batches")
            elif loaded and skip:
                warn_user("skip_first_batches is not needed after load_state with "
                          "use_stateful_dataloader=True: the loader already resumes with "
                          "the next unseen batch")
            skip = requested_skip
        self._next, self._next_loaded = None, False
        self._started = True
        self._passes += 1
        self.epoch, self._yielded = epoch, skip
        self._source.set_epoch(epoch)
        self._start_generator()
        return epoch, skip

    def _start_generator(self) -> None:
        """Put the pass generator in its start state: a restored one, else rank 0's (what
        Accelerate's "generator" RNG synchronization does at the start of every pass)."""
        generator = self._source.pass_generator
        if generator is None:
            return
        restored, self._restored_state = self._restored_state, None
        if restored is not None:
            generator.set_state(restored)
        elif self._sync is not None:
            state = generator.get_state()
            self._sync(state)
            generator.set_state(state)
        self._pass_state = generator.get_state()

    def _upcoming(self, position: tuple[int, int]) -> tuple[int, int]:
        """``(epoch, skip)`` of the next pass from a saved one: a position saved after the
        epoch's last batch is the start of the next epoch."""
        epoch, skip = position
        if skip and self._complete(skip):
            return epoch + 1, 0
        return epoch, skip

    def _complete(self, skip: int) -> bool:
        try:
            return skip >= self._source.num_rounds()
        except TypeError:  # unknown length: the rest of the epoch is empty, then the next one
            return False

    def __len__(self) -> int:
        return len(self._source)

    @property
    def iteration(self) -> int:
        """Accelerate's name for :attr:`epoch`: the pass in progress, or the next one."""
        return self.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` (its shuffle order) for the next pass.

        The loader's sampler, batch sampler and dataset that have ``set_epoch`` get it at once
        (as in Accelerate), and again when the pass starts. After ``load_state_dict`` restored
        a position in ``epoch`` (a script that calls ``set_epoch`` at the start of every
        epoch), the position is kept.
        """
        epoch = int(epoch)
        self._source.set_epoch(epoch)
        if self._next is not None and self._next_loaded:
            restored = self._upcoming(self._next)
            if restored[0] == epoch:
                return
            warn_user(f"set_epoch({epoch}) drops the position restored by load_state "
                      f"(epoch {restored[0]}, after batch {restored[1]}): the next pass is "
                      f"epoch {epoch} from its first batch")
        self._next, self._next_loaded = (epoch, 0), False
        self.epoch = epoch

    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether ``load_state`` restores this loader's position (Accelerate's switch)."""
        return bool(self._config.use_stateful_dataloader)

    @property
    def batch_sampler(self) -> Any:
        """The batch sampler that feeds this rank: for map-style loaders that ``prepare()``
        sharded, a ``BatchSamplerShard``-like sampler whose ``batch_sampler`` is the user's."""
        return self._source.loader.batch_sampler

    @property
    def remainder(self) -> int:
        """Padding duplicates in the batch just yielded."""
        return self.current_batch_len - self.current_real_len

    def trim_for_metrics(self, data: Any) -> Any:
        """Cut ``data`` computed on the current batch to its real samples (see ``trim_batch``)."""
        return trim_batch(data, self.current_batch_len, self.current_real_len)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: the next pass resumes with the next unseen batch."""
        if self._passes:
            upcoming = (self.epoch, self._yielded)
        elif self._next is not None:
            upcoming = self._next
        else:
            upcoming = (self.epoch + 1 if self._started else self.epoch, 0)
        return {"version": _STATE_VERSION, "epoch": self.epoch,
                "batches_yielded": self._yielded, "iterating": self._passes > 0,
                "next_epoch": upcoming[0], "next_skip": upcoming[1], "seed": self._seed,
                "world_size": self._ctx.world_size, "batch_size": self.batch_size,
                "split_batches": bool(self._config.split_batches),
                "rank_local": self._source.rank_local,
                **self._generator_state(upcoming)}

    def _generator_state(self, upcoming: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The pass generator's state where the next pass starts: at the start of the current
        pass when resuming inside it, else its state now."""
        generator = self._source.pass_generator
        if generator is None:
            return {}
        if self._passes and self._pass_state is not None and not (
                upcoming[1] and self._complete(upcoming[1])):
            state = self._pass_state
        elif self._restored_state is not None:
            state = self._restored_state
        else:
            state = generator.get_state()
        return {"generator": state.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s output (possibly written with another world size)."""
        missing = {"next_epoch", "next_skip", "seed", "world_size"} - set(state)
        if missing or state.get("version") not in _READABLE_VERSIONS:
            raise ValueError(f"not a data loader state (version {_STATE_VERSION}): missing "
                             f"{sorted(missing)}, version {state.get('version')!r}")
        skip = int(state["next_skip"])
        if state.get("rank_local") and skip and int(state["world_size"]) != self._ctx.world_size:
            raise ValueError(
                f"cannot resume a rank-local stream's position (epoch {state['next_epoch']}, "
                f"after batch {skip}) saved with {state['world_size']} processes on "
                f"{self._ctx.world_size}: each rank read its own stream, and those change with "
                "the number of processes; resume at an epoch boundary or with the same world size")
        skip = _convert_skip(skip, old_world=int(state["world_size"]),
                             new_world=self._ctx.world_size,
                             split=bool(state.get("split_batches")))
        generator = state.get("generator")
        lost = self._source.pass_generator is not None and generator is None
        if skip and ((state["version"] == 1 and self._source.seeded) or lost):
            warn_user(
                f"this data loader position (epoch {state['next_epoch']}, after batch {skip}) was "
                "saved by an accel version (or use_seedable_sampler setting) that shuffled in "
                "another order: the rest of that "
                "epoch follows the current order, so some of its samples may repeat or be left "
                "out; later epochs are unaffected")
        seed = int(state["seed"])
        chosen = self._config.data_seed
        if chosen is not None and chosen != seed:
            warn_user(f"data_seed={chosen} differs from the checkpoint's data seed {seed}; "
                      "the checkpoint's seed is used so that the data order resumes exactly")
        self._seed = seed
        self._source.set_seed(seed)
        if self._source.pass_generator is not None and isinstance(generator, torch.Tensor):
            self._restored_state = generator.to(torch.uint8).clone()
        self.epoch = int(state.get("epoch", state["next_epoch"]))
        self._next = (int(state["next_epoch"]), skip)
        self._next_loaded = True

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not set in __init__: other DataLoader attributes (num_workers,
        # collate_fn, ...) come from the user's loader.
        if name.startswith("_") or name == "base_dataloader":
            raise AttributeError(name)
        return getattr(self.base_dataloader, name)


def _convert_skip(skip: int, *, old_world: int, new_world: int, split: bool) -> int:
    """Batches to skip when a position saved with ``old_world`` ranks resumes with ``new_world``
    (each round covers the same samples in split mode; otherwise world x batch_size)."""
    if old_world == new_world or split or skip == 0:
        return skip
    if (skip * old_world) % new_world:
        raise ValueError(
            f"cannot resume a data position saved with {old_world} processes ({skip} batches "
            f"each) on {new_world} processes: {skip * old_world} batches is not a whole number "
            f"of rounds of {new_world}; resume at an epoch boundary or with the same world size")
    return skip * old_world // new_world


def build_prepared_loader(loader: DataLoader[Any], *, ctx: ProcessContext,
                          comm: Communicator, device: torch.device | None,
                          config: DataLoaderConfiguration, tracker: DataTracker, seed: int,
                          after_batch: Callable[[], None] | None = None) -> PreparedDataLoader:
    """Shard ``loader`` by rank (once), place its batches on ``device`` and track it.

    ``seed`` must be the same on every rank (``config.data_seed`` wins when set).
    ``after_batch`` is the device's per-batch hook (``Device.batch_hook()``; XLA's mark_step).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from accel.config import DataLoaderConfiguration
        >>> from accel.distributed import Communicator, ProcessContext
        >>> ctx = ProcessContext.single()
        >>> dl = build_prepared_loader(DataLoader(range(4), batch_size=2), ctx=ctx,
        ...     comm=Communicator(ctx), device=None, config=DataLoaderConfiguration(),
        ...     tracker=DataTracker(), seed=0)
        >>> len(dl), dl.total_batch_size
        (2, 2)
    """
    if isinstance(loader, PreparedDataLoader):
        if loader._tracker is tracker:
            return loader
        raise ValueError("this data loader was prepared by another Accelerator; pass the "
                         "original DataLoader to prepare()")
    if not isinstance(loader, DataLoader):
        raise TypeError(f"build_prepared_loader needs a torch.utils.data.DataLoader, got "
                        f"{type(loader).__name__}")
    seed = config.data_seed if config.data_seed is not None else int(seed)
    source = select_source(loader, ctx=ctx, config=config, seed=seed, comm=comm)
    check_same_everywhere(loader, source=source, comm=comm,
                          already_sharded=bool(config.already_sharded))
    sync = comm.broadcast if comm.ctx.world_size > 1 else None
    cls = prepared_loader_class(config)
    return cls(loader, source, ctx=ctx, device=device, config=config, tracker=tracker,
               seed=seed, after_batch=after_batch, sync=sync)


def prepared_loader_class(config: DataLoaderConfiguration) -> type[PreparedDataLoader]:
    """The class of the loaders prepared with ``config``: with ``use_stateful_dataloader=True``
    and torchdata installed, a ``PreparedDataLoader`` that is also torchdata's
    ``StatefulDataLoader`` (its iteration and state stay accel's); else ``PreparedDataLoader``.

    Example:
        >>> from accel.config import DataLoaderConfiguration
        >>> prepared_loader_class(DataLoaderConfiguration()).__name__
        'PreparedDataLoader'
    """
    if config.use_stateful_dataloader:
        return stateful_variant(PreparedDataLoader) or PreparedDataLoader
    return PreparedDataLoader


@contextlib.contextmanager
def override_even_batches(loaders: Iterable[PreparedDataLoader], *, even: bool
                          ) -> Iterator[None]:
    """Inside the block, the map-style ``loaders`` shard with ``even_batches=even``; their own
    values come back on exit (``Accelerator.join_uneven_inputs(even_batches=...)``).

    Loaders of iterable datasets, and loaders that were already sharded (a
    ``DistributedSampler``), keep theirs, with a warning (on every rank, as Accelerate's) at the
    user's ``with`` statement.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from accel.config import DataLoaderConfiguration
        >>> from accel.distributed import ProcessContext
        >>> from accel.data.sources import MapSource
        >>> ctx = ProcessContext(rank=1, local_rank=1, world_size=2, local_world_size=2,
        ...     node_rank=0, device=torch.device("cpu"), backend="gloo", launcher="none")
        >>> base = DataLoader(range(3), batch_size=1)
        >>> source = MapSource(base, rank=1, world=2, even=True, split=False, seed=0)
        >>> dl = PreparedDataLoader(base, source, ctx=ctx, device=None,
        ...     config=DataLoaderConfiguration(), tracker=DataTracker(), seed=0)
        >>> with override_even_batches([dl], even=False):
        ...     len(dl), dl.batch_sampler.even_batches  # batch 1 only: 3 batches, 2 ranks
        (1, False)
        >>> len(dl), dl.batch_sampler.even_batches  # batch 1, then a padding duplicate
        (2, True)
    """
    changed: list[tuple[Any, bool]] = []
    kept = 0
    for loader in loaders:
        shard = loader._source.shard_sampler()
        if shard is None:
            kept += 1
            continue
        changed.append((shard, shard.even_batches))
        shard.even_batches = even
    if kept:
        warn_user(
            "overriding even_batches is only supported for map-style datasets that prepare() "
            f"shards: {kept} prepared loader(s) read an iterable dataset (or were already "
            f"sharded by a DistributedSampler) and keep their even_batches")
    try:
        yield
    finally:
        for shard, value in changed:
            shard.even_batches = value


class _SkippedLoader:
    """A plain iterable loader whose passes leave out their first batches."""

    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader = loader
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self.loader, PreparedDataLoader):
            return self.loader._iterate(self.num_batches)
        iterator: Iterator[Any] = iter(self.loader)
        for _ in range(self.num_batches):
            if next(iterator, _END) is _END:
                return iter(())
        return iterator

    def __len__(self) -> int:
        return max(0, len(self.loader) - self.num_batches)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("loader", "num_batches"):
            raise AttributeError(name)
        return getattr(self.loader, name)


_END: Any = object()


def skip_first_batches(loader: Any, num_batches: int) -> Any:
    """A loader whose next pass leaves out the first ``num_batches`` batches.

    Works on prepared loaders (the pass keeps sharding and tracking; after ``load_state`` it
    skips from the start of the epoch, as in Accelerate; with ``use_stateful_dataloader=True``
    the loader resumes by itself and needs no skipping) and on plain ``DataLoader``s
    (map-style ones skip at the sampler, so the skipped samples are never loaded).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> [b.tolist() for b in skip_first_batches(DataLoader(range(5), batch_size=2), 1)]
        [[2, 3], [4]]
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    if isinstance(loader, DataLoader) and not isinstance(loader, PreparedDataLoader) and \
            not isinstance(loader.dataset, IterableDataset):  # (a stateful one is a DataLoader)
        if loader.batch_sampler is not None:
            return rebuild_loader(loader, batch_sampler=SkipBatchSampler(loader.batch_sampler,
                                                                         num_batches))
        return rebuild_loader(loader, batch_size=None,
                              sampler=SkipBatchSampler(loader.sampler, num_batches))
    return _SkippedLoader(loader, num_batches)
