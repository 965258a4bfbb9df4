"""The interface every training strategy implements: how a model is wrapped and synchronised.

A strategy is chosen once per ``Accelerator`` by :func:`accel.strategy.select_strategy` and is
the only code that knows the wrapper types (DDP today, FSDP next): the facade, the training
step and the checkpoint protocol call these methods and never test ``isinstance`` themselves.

Example:
    >>> import torch
    >>> from accel.distributed import ProcessContext
    >>> from accel.strategy import select_strategy
    >>> ctx = ProcessContext.single()
    >>> strategy = select_strategy(ctx)
    >>> model = strategy.wrap_model(torch.nn.Linear(2, 1))
    >>> strategy.unwrap(model) is model, strategy.name, strategy.replicates_model
    (True, 'single', True)
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from .._base.warn import warn_user
from ..config.settings import DistributedDataParallelKwargs
from ..distributed import ProcessContext
from ..distributed.batchnorm import BatchNormSync, convert_sync_batchnorm
from .compile import compiled_inner, rewrap_compiled
from .rank0_load import refuse_meta_model

__all__ = ["Strategy", "SyncSetting", "as_batchnorm_sync", "no_join", "strip_compile",
           "strip_parallel", "unwrap_module"]

#: ``wrap_model``'s ``sync_batchnorm``: a mode and group, True (all processes) or False/None
SyncSetting = BatchNormSync | bool | None


def as_batchnorm_sync(value: SyncSetting) -> BatchNormSync | None:
    """``wrap_model``'s ``sync_batchnorm`` as a :class:`BatchNormSync` (None: leave BatchNorm)."""
    if isinstance(value, BatchNormSync):
        return value
    return BatchNormSync() if value else None


def strip_parallel(model: nn.Module) -> nn.Module:
    """Strip the data-parallel (DDP) wrappers around ``model``; a compile wrapper stays."""
    while isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    return model


def strip_compile(model: nn.Module) -> nn.Module:
    """Strip the ``torch.compile`` wrappers around ``model`` (``compile(DDP(m))`` gives the DDP)."""
    while (inner := compiled_inner(model)) is not None:
        model = inner
    return model


def unwrap_module(model: nn.Module, *, keep_torch_compile: bool = False) -> nn.Module:
    """Strip DDP (and ``nn.DataParallel``) / torch.compile wrappers and return the user's module.

    With ``keep_torch_compile`` a compiled model comes back compiled: the compile wrapper
    around the user's module, or, for ``torch.compile(DDP(module))``, a new one with the same
    settings around ``module`` (the trained wrapper is never changed).
    """
    seen, compiled = set(), None
    while id(model) not in seen:
        seen.add(id(model))
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif (inner := compiled_inner(model)) is not None:
            compiled, model = model, inner
    if keep_torch_compile and compiled is not None:
        kept = rewrap_compiled(compiled, model)
        if kept is not None:
            return kept
        warn_user(f"unwrap_model(keep_torch_compile=True): the regions compiled around "
                  f"{type(compiled_inner(compiled)).__name__} cannot be kept around the "
                  "module inside it; returning the plain module. Compile the regions of "
                  "the module itself (accel's prepare() does)")
    return model


class Strategy(ABC):
    """How models are placed, wrapped, synchronised and saved for one ``Accelerator``.

    Args:
        ctx: this process's place in the job.
        place: move models to ``ctx.device`` (``Accelerator(device_placement=...)``).
        ddp_kwargs: DDP options (``DistributedDataParallelKwargs``), used by strategies that wrap.
    """

    #: short name shown in reports and warnings (``"single"``, ``"ddp"``, ``"fsdp"``, ``"xla"``);
    #: the compatibility layer derives Accelerate's ``DistributedType`` from it
    name: str = ""
    #: every rank holds the whole model and steps its own optimizer on it, and ``no_sync``
    #: really keeps gradients local (what LocalSGD needs to average replicas)
    replicates_model: bool = False
    #: the model's state lives in shards on every rank (DTensors): reading or writing it is a
    #: collective, through ``torch.distributed.checkpoint.state_dict`` for models and optimizers
    distributed_state: bool = False
    #: ``save_state`` writes each rank's shards (FSDP's SHARDED_STATE_DICT) rather than full
    #: state dicts written by rank 0
    sharded_state: bool = False

    def __init__(self, ctx: ProcessContext, place: bool = True,
                 ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        self.ctx = ctx
        self.place = place
        self.ddp_kwargs = ddp_kwargs or DistributedDataParallelKwargs()

    def with_placement(self, place: bool) -> Strategy:
        """This strategy, placing models on the device or not (``prepare(device_placement)``)."""
        if place == self.place:
            return self
        return type(self)(self.ctx, place, self.ddp_kwargs)

    # -- models --------------------------------------------------------------------------------
    def place_model(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to the device when placement is on (inference: never wrapped)."""
        if not self.place:
            return model
        refuse_meta_model(model, self.name)  # torch's own error would not say what to do
        return model.to(self.ctx.device)

    @abstractmethod
    def wrap_model(self, model: nn.Module, sync_batchnorm: SyncSetting = False) -> nn.Module:
        """Place ``model`` and wrap it for training under this strategy.

        ``sync_batchnorm``: a :class:`~accel.distributed.batchnorm.BatchNormSync` (mode and
        group), True (every process) or False/None (BatchNorm layers left alone).
        """

    def _convert_and_place(self, model: nn.Module, sync_batchnorm: SyncSetting) -> nn.Module:
        """SyncBatchNorm (several processes only), then placement: what every wrap starts with."""
        refuse_meta_model(model, self.name)  # a model without weights cannot be trained
        return self.place_model(self.convert_batchnorm(model, sync_batchnorm))

    def convert_batchnorm(self, model: nn.Module, sync_batchnorm: SyncSetting) -> nn.Module:
        """BatchNorm layers as SyncBatchNorm over the chosen group (torch's class on CUDA,
        accel's CPU-capable one elsewhere); at world size 1 there is nothing to synchronise and
        the model comes back as it is."""
        sync = as_batchnorm_sync(sync_batchnorm)
        if sync is None or not self.ctx.is_distributed:
            return model
        return convert_sync_batchnorm(model, sync.group, self.ctx.device)

    def unwrap(self, model: nn.Module, *, keep_torch_compile: bool = False) -> nn.Module:
        """The user's module inside whatever ``wrap_model`` (or torch.compile) put around it;
        still compiled with ``keep_torch_compile`` (see :func:`unwrap_module`)."""
        return unwrap_module(model, keep_torch_compile=keep_torch_compile)

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse an optimizer whose parameters are not where the model's are (the fix named)."""

    # -- gradient synchronisation ----------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient synchronisation in backward (accumulation micro-steps)."""
        return contextlib.nullcontext()

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Synchronise in a backward run inside the block, also when its forward (or the whole
        block) is under ``no_sync``."""
        return contextlib.nullcontext()

    @property
    def joins_uneven_inputs(self) -> bool:
        """Whether ``join`` lets ranks with fewer batches finish (several DDP processes)."""
        return False

    def join(self, joinables: Iterable[Any], *, enable: bool = True
             ) -> contextlib.AbstractContextManager[Any]:
        """Let ranks with fewer batches shadow the others' collectives (torch ``Join``), when
        ``enable``. Strategies without it warn when distributed, as Accelerate does."""
        if self.ctx.is_distributed:
            return no_join(self.name.upper())
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        """Hook after each backward pass."""

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook before the optimizer steps (e.g. reduce gradients on XLA)."""

    def after_optimizer_step(self) -> None:
        """Hook after the optimizer stepped (e.g. XLA's mark_step)."""

    # -- clipping --------------------------------------------------------------------------------
    def clip_grad_norm_(self, parameters: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor:
        """Clip by the global norm of the (already synchronised, unscaled) gradients."""
        return nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        nn.utils.clip_grad_value_(parameters, clip_value)

    # -- state dicts ---------------------------------------------------------------------------
    def state_module(self, model: nn.Module) -> nn.Module:
        """The module to hand to ``torch.distributed.checkpoint.state_dict``'s functions."""
        return self.unwrap(model)

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict of the user's module inside ``model``."""
        return dict(self.unwrap(model).state_dict())

    def load_model_state_dict(self, model: nn.Module, *, state: dict[str, torch.Tensor],
                              strict: bool = True) -> Any:
        """Load a full state dict into the user's module; returns missing/unexpected keys."""
        return self.unwrap(model).load_state_dict(state, strict=strict)


def no_join(kind: str) -> contextlib.AbstractContextManager[None]:
    """``join_uneven_inputs`` where torch's Join does not apply (not DDP): Accelerate's warning
    naming the kind of job (e.g. ``"FSDP"``), at the user's line, and a block that changes
    nothing."""
    warn_user("joining uneven inputs is only supported for multi-GPU (and multi-CPU) DDP "
              f"training; with {kind} `join_uneven_inputs` has no effect")
    return contextlib.nullcontext()
