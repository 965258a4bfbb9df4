"""What ``Accelerator.prepare`` does to each kind of object, and the registry of what it did.

``Preparer`` owns the lists of prepared models, optimizers, schedulers and data loaders (one per
Accelerator, no globals); the Accelerator delegates ``prepare*`` to it.

Example:
    >>> import torch
    >>> from accel import Accelerator
    >>> acc = Accelerator(cpu=True)
    >>> model, opt = acc.prepare(torch.nn.Linear(2, 1), torch.optim.SGD([torch.zeros(1)], lr=1))
    >>> type(opt).__name__
    'AcceleratedOptimizer'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import _tree
from .accumulation import AccumulationState
from .config import DataLoaderConfiguration, PrecisionType
from .data import DataTracker, PreparedDataLoader, prepare_data_loader
from .distributed import Communicator
from .precision import Precision, check_trainable_dtypes
from .strategy import Strategy, select_strategy
from .wrappers import AcceleratedOptimizer, AcceleratedScheduler

__all__ = ["Preparer", "remove_autocast"]


def _is_scheduler(obj: Any) -> bool:
    base = getattr(torch.optim.lr_scheduler, "LRScheduler", None)
    return (base is not None and isinstance(obj, base)) or isinstance(
        obj, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _to_fp32(data: Any) -> Any:
    return _tree.apply(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t,
                       data)


def remove_autocast(module: nn.Module) -> None:
    """Undo the autocast ``forward`` that ``prepare`` installed on ``module`` (if any)."""
    patched = module.__dict__.get("forward")
    original = getattr(patched, "_accel_original", None)
    if original is None:
        return
    if getattr(original, "__func__", None) is type(module).forward:
        del module.__dict__["forward"]  # back to the class's own forward
    else:
        module.forward = original  # type: ignore[method-assign]


@dataclass
class Preparer:
    """Prepares objects for one Accelerator and remembers them."""

    comm: Communicator
    precision: Precision
    strategy: Strategy
    accumulation: AccumulationState
    tracker: DataTracker
    dataloader_config: DataLoaderConfiguration
    step_scheduler_with_optimizer: bool = True
    sync_batchnorm: bool = False
    models: list[nn.Module] = field(default_factory=list)
    optimizers: list[AcceleratedOptimizer] = field(default_factory=list)
    schedulers: list[AcceleratedScheduler] = field(default_factory=list)
    dataloaders: list[PreparedDataLoader] = field(default_factory=list)
    prepared_ids: set[int] = field(default_factory=set)
    data_seed: int | None = None

    @property
    def device(self) -> torch.device:
        return self.comm.ctx.device

    def prepare(self, args: tuple[Any, ...], places: list[bool]) -> list[Any]:
        if len(places) != len(args):
            raise ValueError(f"device_placement has {len(places)} entries for {len(args)} "
                             "objects; give one bool per object")
        if len({id(obj) for obj in args}) != len(args):
            dup = next(o for i, o in enumerate(args) if any(o is p for p in args[:i]))
            raise ValueError(f"prepare() got the same {type(dup).__name__} twice; "
                             "pass each object once")
        out: list[Any] = list(args)
        done = {i for i, obj in enumerate(args) if id(obj) in self.prepared_ids}
        moved: dict[int, nn.Parameter] = {}  # old -> new parameter objects (XLA replaces them)
        for kind in (nn.Module, torch.optim.Optimizer, "scheduler", torch.utils.data.DataLoader):
            for i, obj in enumerate(args):  # models first so optimizers see moved parameters
                if i in done:
                    continue
                if kind == "scheduler" and _is_scheduler(obj):
                    out[i] = self.prepare_scheduler(obj)
                elif isinstance(kind, type) and isinstance(obj, kind):
                    out[i] = self._prepare_one(obj, places[i], moved)
                else:
                    continue
                done.add(i)
        for i, obj in enumerate(args):
            if i not in done:
                raise TypeError(
                    f"prepare() cannot handle {type(obj).__name__} (argument {i}); it accepts "
                    "nn.Module, torch.optim.Optimizer, LR schedulers and torch DataLoader")
            self.prepared_ids.add(id(out[i]))
        return out

    def _prepare_one(self, obj: Any, place: bool, moved: dict[int, nn.Parameter]) -> Any:
        if isinstance(obj, nn.Module):
            before = list(obj.parameters())
            wrapped = self.prepare_model(obj, place)
            moved.update({id(o): n for o, n in zip(before, obj.parameters()) if o is not n})
            return wrapped
        if isinstance(obj, torch.optim.Optimizer):
            return self.prepare_optimizer(obj, moved)
        return self.prepare_data_loader(obj, place)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer,
                          moved: dict[int, nn.Parameter] | None = None) -> AcceleratedOptimizer:
        """Wrap ``optimizer``; point it at the model's placed parameters (new objects on XLA)."""
        for group in optimizer.param_groups:
            group["params"] = [(moved or {}).get(id(p), p) for p in group["params"]]
        if self.strategy.place and self.device.type == "xla":
            stale = [p for g in optimizer.param_groups for p in g["params"]
                     if p.device.type != self.device.type]
            if stale:
                raise ValueError(
                    f"{len(stale)} optimizer parameter(s) are not on {self.device}; pass the "
                    "model and its optimizer to the same prepare() call, or create the "
                    "optimizer after prepare(model)")
        opt = AcceleratedOptimizer(optimizer, self.precision, self.strategy, self.accumulation)
        self.optimizers.append(opt)
        return opt

    def prepare_model(self, model: nn.Module, place: bool = True,
                      evaluation_mode: bool = False) -> nn.Module:
        """Move ``model`` to the device, wrap it for the strategy (DDP), add autocast."""
        check_trainable_dtypes(self.precision.mode, model.named_parameters())
        strategy = self.strategy
        if not place and strategy.place:
            strategy = select_strategy(self.comm.ctx, False, strategy.ddp_kwargs)
        if evaluation_mode:  # inference only: placed, never wrapped in DDP
            wrapped = model.to(self.device) if strategy.place else model
        else:
            wrapped = strategy.wrap_model(model, self.sync_batchnorm)
        if self.precision.mode is not PrecisionType.NO:
            original = wrapped.forward
            context = self.precision.forward_context

            @functools.wraps(original)
            def forward(*a: Any, **kw: Any) -> Any:
                with context():
                    return _to_fp32(original(*a, **kw))

            forward._accel_original = original  # type: ignore[attr-defined]
            wrapped.forward = forward  # type: ignore[method-assign]
        self.models.append(wrapped)
        return wrapped

    def prepare_data_loader(self, data_loader: torch.utils.data.DataLoader,
                            place: bool = True) -> PreparedDataLoader:
        """Shard ``data_loader`` by rank and move its batches to the device."""
        loader = prepare_data_loader(
            data_loader, ctx=self.comm.ctx, comm=self.comm,
            device=self.device if place else None, config=self.dataloader_config,
            tracker=self.tracker, seed=self.agreed_seed())
        if loader not in self.dataloaders:
            self.dataloaders.append(loader)
        return loader

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        inner = getattr(scheduler, "optimizer", None)
        optimizers = [o for o in self.optimizers if o.optimizer is inner or o is inner]
        wrapped = AcceleratedScheduler(
            scheduler, optimizers or list(self.optimizers), self.accumulation,
            self.comm.ctx.world_size, self.dataloader_config.split_batches,
            self.step_scheduler_with_optimizer)
        self.schedulers.append(wrapped)
        return wrapped

    def agreed_seed(self) -> int:
        """The data-order seed every rank uses (data_seed, else rank 0's torch seed)."""
        if self.data_seed is None:
            seed = self.dataloader_config.data_seed
            if seed is None:
                seed = self.comm.broadcast_object_list([torch.initial_seed() % (2**63)])[0]
            self.data_seed = int(seed)
        return self.data_seed

    def clear(self) -> None:
        for registry in (self.models, self.optimizers, self.schedulers, self.dataloaders):
            registry.clear()
        self.prepared_ids.clear()
