"""What ``Accelerator.prepare`` does to each kind of object.

``Preparer`` records what it prepared in the run state it is given (one per Accelerator, no
globals); the model's wrapping is the strategy's and its forward wrapper the precision's.

Example:
    >>> import torch
    >>> from accel import Accelerator
    >>> acc = Accelerator(cpu=True)
    >>> model, opt = acc.prepare(torch.nn.Linear(2, 1), torch.optim.SGD([torch.zeros(1)], lr=1))
    >>> type(opt).__name__
    'AcceleratedOptimizer'
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._base.warn import warn_user
from ..config.settings import DataLoaderConfiguration
from ..data import PreparedDataLoader, build_prepared_loader
from ..distributed import Communicator
from ..distributed.batchnorm import BatchNormSync
from ..precision import Precision
from ..strategy import Strategy
from ..strategy.compile import (
    TorchDynamoPlugin,
    compile_model,
    compiled_inner,
    compiles_inside_wrapper,
    has_compiled_regions,
)
from .connector import Options, Runtime
from .state import RunState
from .wrappers import AcceleratedOptimizer, AcceleratedScheduler

__all__ = ["Preparer", "check_quantized_placement"]


_log = logging.getLogger(__name__)


def _is_preparable(obj: Any) -> bool:
    """A model, optimizer, scheduler or DataLoader: what ``prepare`` handles."""
    return isinstance(obj, (nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader)) \
        or _is_scheduler(obj)


def _is_scheduler(obj: Any) -> bool:
    base = getattr(torch.optim.lr_scheduler, "LRScheduler", None)
    return (base is not None and isinstance(obj, base)) or isinstance(
        obj, torch.optim.lr_scheduler.ReduceLROnPlateau)


Replaced = dict[int, tuple["weakref.ref[nn.Parameter]", nn.Parameter]]


def check_quantized_placement(model: nn.Module, *, distributed: bool) -> None:
    """Refuse to train an 8-bit/4-bit (bitsandbytes) model dispatched by a ``device_map`` that
    offloads part of it to the CPU or disk, or spreads it over devices in a distributed job.

    Raises:
        ValueError: such a model (Accelerate refuses the same ones).
    """
    quantized = getattr(model, "is_loaded_in_8bit", False) or \
        getattr(model, "is_loaded_in_4bit", False)
    device_map = getattr(model, "hf_device_map", None)
    if not quantized or not isinstance(device_map, dict) or not device_map:
        return
    devices = {str(d) for d in device_map.values()}
    if "cpu" in devices or "disk" in devices:
        raise ValueError("prepare(): a model loaded in 8-bit or 4-bit precision cannot be trained "
                         "with CPU or disk offload (its device_map places modules on "
                         f"{sorted(devices)}); load it wholly on the accelerator, e.g. "
                         "device_map={'': torch.cuda.current_device()}")
    if len(devices) > 1 and distributed:
        raise ValueError("prepare(): a model loaded in 8-bit or 4-bit precision and spread over "
                         f"devices {sorted(devices)} cannot be trained in a distributed job; "
                         "load it on this process's device, or run one process")


def _replacement(moved: Replaced, param: torch.Tensor) -> torch.Tensor:
    """The parameter that replaced ``param``, else ``param`` itself."""
    entry = moved.get(id(param))
    return entry[1] if entry is not None and entry[0]() is param else param


def _repoint(optimizer: torch.optim.Optimizer, moved: Replaced) -> None:
    """Point ``optimizer``'s groups (and any state it holds) at the replacing parameters."""
    for group in optimizer.param_groups:
        group["params"] = [_replacement(moved, p) for p in group["params"]]
    for old in list(optimizer.state):
        new = _replacement(moved, old)
        if new is not old:
            optimizer.state[new] = optimizer.state.pop(old)


def _both(first: Callable[[], None] | None, second: Callable[[], None] | None
          ) -> Callable[[], None] | None:
    """One per-batch callback calling ``first`` then ``second`` (either may be None)."""
    if first is None or second is None:
        return first or second

    def both() -> None:
        first()
        second()
    return both


@dataclass(frozen=True, kw_only=True, slots=True)
class Preparer:
    """Prepares objects for one Accelerator and records them in ``run``."""

    comm: Communicator
    precision: Precision
    strategy: Strategy
    run: RunState
    dataloader_config: DataLoaderConfiguration
    step_scheduler_with_optimizer: bool = True
    #: what happens to BatchNorm layers of trained models (None: nothing)
    sync_batchnorm: BatchNormSync | None = None
    #: the device's per-batch hook for placed loaders (``Device.batch_hook()``)
    after_batch: Callable[[], None] | None = None
    #: how models are compiled (None, or backend "no": not compiled)
    dynamo: TorchDynamoPlugin | None = None

    @classmethod
    def for_run(cls, runtime: Runtime, options: Options, run: RunState) -> Preparer:
        """The preparer of an Accelerator: its runtime's collaborators, its options, its run."""
        return cls(comm=runtime.comm, precision=runtime.precision, strategy=runtime.strategy,
                   run=run, dataloader_config=options.dataloader_config,
                   step_scheduler_with_optimizer=options.step_scheduler_with_optimizer,
                   sync_batchnorm=runtime.batchnorm, after_batch=runtime.hardware.batch_hook(),
                   dynamo=options.dynamo_plugin, progress=runtime.monitor.mark)
    #: called for every batch of every prepared loader (the collective monitor's progress mark)
    progress: Callable[[], None] | None = None

    @property
    def device(self) -> torch.device:
        return self.comm.ctx.device

    def prepare(self, args: tuple[Any, ...], places: list[bool]) -> list[Any]:
        """Prepare each object by kind; objects of other kinds come back unchanged.

        Accelerate returns what it does not handle (scripts pass ``None`` or EMA helpers
        through ``prepare``); a debug log line names each such object.
        """
        if len(places) != len(args):
            raise ValueError(f"device_placement has {len(places)} entries for {len(args)} "
                             "objects; give one bool per object")
        handled = [obj for obj in args if _is_preparable(obj)]
        if len({id(obj) for obj in handled}) != len(handled):
            dup = next(o for i, o in enumerate(handled) if any(o is p for p in handled[:i]))
            raise ValueError(f"prepare() got the same {type(dup).__name__} twice; "
                             "pass each object once")
        out: list[Any] = list(args)
        done = {i for i, obj in enumerate(args) if id(obj) in self.run.prepared_ids}
        moved = self.run.replaced  # old -> new parameter objects (XLA and FSDP replace them)
        for kind in (nn.Module, torch.optim.Optimizer, "scheduler", torch.utils.data.DataLoader):
            for i, obj in enumerate(args):  # models first so optimizers see moved parameters
                if i in done:
                    continue
                if kind == "scheduler" and _is_scheduler(obj):
                    out[i] = self.prepare_scheduler(obj)
                elif isinstance(kind, type) and isinstance(obj, kind):
                    out[i] = self._prepare_one(obj, place=places[i], moved=moved)
                else:
                    continue
                done.add(i)
        for i, obj in enumerate(args):
            if i not in done:
                _log.debug("prepare(): argument %d (%s) is not a model, optimizer, scheduler or "
                           "DataLoader; returned unchanged", i, type(obj).__name__)
                continue
            self.run.prepared_ids.add(id(out[i]))
        return out

    def _prepare_one(self, obj: Any, *, place: bool, moved: Replaced) -> Any:
        if isinstance(obj, nn.Module):
            before = list(obj.parameters())
            wrapped = self.prepare_model(obj, place=place)
            after = obj.parameters()
            new = {id(o): (weakref.ref(o), n) for o, n in zip(before, after, strict=True)
                   if o is not n}
            del before  # the unsharded parameters go once nothing else holds them
            for key in [k for k, (old, _) in moved.items() if old() is None]:
                del moved[key]  # gone: their ids may be reused
            moved.update(new)
            for opt in self.run.optimizers:  # prepared before the model: point them at it
                _repoint(opt.optimizer, new)
            return wrapped
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, moved)
        return self.prepare_data_loader(obj, place=place)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          moved: Replaced | None = None) -> AcceleratedOptimizer:
        """Wrap ``optimizer``; point it at the prepared models' parameters (new objects on XLA
        and with FSDP), whichever of the two was prepared first."""
        _repoint(optimizer, self.run.replaced if moved is None else moved)
        self.strategy.check_optimizer(optimizer)
        opt = AcceleratedOptimizer(optimizer, self.precision, self.strategy, self.run)
        self.run.optimizers.append(opt)
        return opt

    def prepare_model(self, model: nn.Module, *, place: bool = True,
                      evaluation_mode: bool = False) -> nn.Module:
        """Move ``model`` to the device, wrap it for the strategy, add the precision's forward,
        and compile the result (``TorchDynamoPlugin``), as Accelerate does: ``torch.compile``
        of the wrapped model. Regional compilation, and a module whose forward is torch's own
        (``nn.Sequential``: dynamo would not compile it inside DDP), compile the user's module
        before it is wrapped instead. A model the user compiled (wholly or in part) is not
        compiled again."""
        self.precision.check_model(model)
        check_quantized_placement(model, distributed=self.comm.ctx.is_distributed)
        strategy = self.strategy.with_placement(place and self.strategy.place)
        dynamo = self._compiler_for(model)
        early = dynamo is not None and (bool(dynamo.use_regional_compilation)
                                        or not compiles_inside_wrapper(model))
        if dynamo is not None and early:
            model = compile_model(strategy.place_model(model), dynamo)
        if evaluation_mode:  # inference only: placed, never wrapped for training
            wrapped = strategy.place_model(model)
        else:
            wrapped = strategy.wrap_model(model, self.sync_batchnorm)
        wrapped = self.precision.wrap_forward(wrapped)
        if dynamo is not None and not early:
            wrapped = compile_model(wrapped, dynamo)
        self.run.models.append(wrapped)
        return wrapped

    def _compiler_for(self, model: nn.Module) -> TorchDynamoPlugin | None:
        """The compile settings for ``model``; None when nothing is to be compiled."""
        if self.dynamo is None or not self.dynamo.compiles:
            return None
        if has_compiled_regions(model):
            if self.comm.ctx.is_main_process:
                inner = compiled_inner(model)
                name = type(model if inner is None else inner).__name__
                warn_user(f"prepare(): {name} is compiled already (torch."
                          "compile before prepare()), so it is not compiled again with "
                          f"dynamo backend {self.dynamo.to_dict()['backend']!r}; drop one of "
                          "the two to silence this")
            return None
        return self.dynamo

    def prepare_data_loader(self, data_loader: torch.utils.data.DataLoader[Any],
                            *, place: bool = True) -> PreparedDataLoader:
        """Shard ``data_loader`` by rank and move its batches to the device."""
        loader = build_prepared_loader(
            data_loader, ctx=self.comm.ctx, comm=self.comm,
            device=self.device if place else None, config=self.dataloader_config,
            tracker=self.run.data, seed=self.agreed_seed(),
            after_batch=_both(self.after_batch if place else None, self.progress))
        if loader not in self.run.dataloaders:
            self.run.dataloaders.append(loader)
        return loader

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        inner = getattr(scheduler, "optimizer", None)
        optimizers = [o for o in self.run.optimizers if o.optimizer is inner or o is inner]
        wrapped = AcceleratedScheduler(
            scheduler, optimizers or list(self.run.optimizers), self.run,
            self.comm.ctx.world_size, self.dataloader_config.split_batches,
            self.step_scheduler_with_optimizer)
        self.run.schedulers.append(wrapped)
        return wrapped

    def agreed_seed(self) -> int:
        """The data-order seed every rank uses (data_seed, else rank 0's torch seed)."""
        if self.run.data_seed is None:
            seed = self.dataloader_config.data_seed
            if seed is None:
                seed = self.comm.broadcast_object_list([torch.initial_seed() % (2**63)])[0]
            self.run.data_seed = int(seed)
        return self.run.data_seed
