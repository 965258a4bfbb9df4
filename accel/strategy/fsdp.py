"""Sharded data parallelism with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each rank keeps a shard of every parameter (a DTensor on a ``DeviceMesh``); a unit's parameters
are gathered before its forward and backward and freed after, and gradients are
reduce-scattered. Units are chosen by :mod:`accel.strategy.fsdp_units`, sharded bottom-up and
then the root. The prepared model is the user's module itself (``fully_shard`` changes its
class in place), so ``unwrap`` has nothing to remove.

State dicts go through ``torch.distributed.checkpoint.state_dict``: full ones are gathered one
tensor at a time onto rank 0 (CPU); sharded ones are what the checkpoint protocol saves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._base.warn import warn_user
from ..config.fsdp import FullyShardedDataParallelPlugin
from ..config.parallelism import ParallelismConfig
from ..config.settings import DistributedDataParallelKwargs, PrecisionType
from ..distributed import ProcessContext
from .base import Strategy, SyncSetting, strip_compile
from .fsdp_units import ignored_parameters, select_units
from .rank0_load import capture_full_state, distribute_from_rank0, refuse_meta_model, to_meta

__all__ = ["FSDPStrategy", "MeshHolder"]


@dataclass(kw_only=True, slots=True)
class MeshHolder:
    """The device mesh, built on first use and shared by the copies of one strategy
    (``with_placement`` makes copies; building a 2-D mesh is a collective)."""

    parallelism: ParallelismConfig
    mesh: Any = field(default=None)

    def get(self, ctx: ProcessContext) -> Any:
        if self.mesh is None:
            self.mesh = self.parallelism.data_parallel_mesh(ctx.device.type, ctx.local_world_size)
        return self.mesh


def _fsdp_root(model: nn.Module) -> Any:
    """The FSDP2 root module ``wrap_model`` made of ``model`` (through a compile wrapper), or
    None for a model that was not sharded; no walk over the modules (called every micro-step)."""
    from torch.distributed.fsdp import FSDPModule

    root = strip_compile(model)
    return root if isinstance(root, FSDPModule) else None


def _is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


class FSDPStrategy(Strategy):
    """FSDP2 over gloo (CPU) or nccl (CUDA), configured by a
    :class:`~accel.config.fsdp.FullyShardedDataParallelPlugin`."""

    name = "fsdp"
    distributed_state = True

    def __init__(self, ctx: ProcessContext, place: bool = True,
                 ddp_kwargs: DistributedDataParallelKwargs | None = None,
                 plugin: FullyShardedDataParallelPlugin | None = None,
                 mesh: MeshHolder | None = None,
                 precision: PrecisionType = PrecisionType.NO) -> None:
        super().__init__(ctx, place, ddp_kwargs)
        self.plugin = plugin or FullyShardedDataParallelPlugin()
        self.mesh = mesh or MeshHolder(parallelism=ParallelismConfig())
        self.precision = precision

    @property
    def sharded_state(self) -> bool:  # type: ignore[override]
        return self.plugin.sharded_state

    def with_placement(self, place: bool) -> Strategy:
        if place == self.place:
            return self
        return FSDPStrategy(self.ctx, place, self.ddp_kwargs, self.plugin, self.mesh,
                            self.precision)

    # -- models --------------------------------------------------------------------------------
    def place_model(self, model: nn.Module) -> nn.Module:
        if _is_meta(model):
            return model  # materialised shard by shard after sharding (rank-0 loading)
        return super().place_model(model)

    def _shard_kwargs(self, ignored: set[nn.Parameter]) -> dict[str, Any]:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kwargs: dict[str, Any] = {"mesh": self.mesh.get(self.ctx),
                                  "reshard_after_forward": self.plugin.reshard_after_forward}
        policy = self.plugin.mixed_precision_policy or self._policy_from_precision()
        if policy is not None:
            kwargs["mp_policy"] = policy
        if self.plugin.cpu_offload and self.ctx.device.type != "cpu":
            kwargs["offload_policy"] = CPUOffloadPolicy()
        if ignored:
            kwargs["ignored_params"] = ignored
        return kwargs

    def _policy_from_precision(self) -> Any:
        """``Accelerator(mixed_precision=...)`` as an FSDP policy (Accelerate's mapping)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = {PrecisionType.BF16: torch.bfloat16,
                 PrecisionType.FP16: torch.float16}.get(self.precision)
        return None if dtype is None else MixedPrecisionPolicy(param_dtype=dtype,
                                                               reduce_dtype=dtype)

    def wrap_model(self, model: nn.Module, sync_batchnorm: SyncSetting = False) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(model, FSDPModule):
            return model  # sharded already (by the user, or an earlier prepare)
        full_state = self._check_initialisation(model)
        model = self.convert_batchnorm(model, sync_batchnorm)
        if self.plugin.sync_module_states and full_state is None:
            self._broadcast_from_rank0(model)
        model = self.place_model(model)
        ignored_modules, ignored = ignored_parameters(model, self.plugin)
        units = select_units(model, self.plugin, ignored_modules)
        if self.plugin.cpu_offload and self.ctx.device.type == "cpu" and \
                self.ctx.is_main_process:
            warn_user("cpu_offload has no effect on a CPU run: the shards are in CPU "
                      "memory already")
        if self.plugin.activation_checkpointing:
            from torch.distributed._composable.checkpoint_activation import checkpoint

            for _, unit in units or [("", model)]:
                checkpoint(unit)
        kwargs = self._shard_kwargs(ignored)
        for _, unit in units:
            fully_shard(unit, **kwargs)
        # the root keeps its parameters from forward to the backward that needs them at once
        # (fully_shard's default for the root): resharding it costs an all-gather per step
        fully_shard(model, **{**kwargs, "reshard_after_forward": None})
        if full_state is not None:
            self._load_from_rank0(model, full_state)
        _average_ignored_gradients(model, ignored, self.ctx.world_size)
        return model

    def _check_initialisation(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Rank 0's full state to send to the others with ``cpu_ram_efficient_loading`` (an
        empty dict on other ranks), else None; meta weights without it are refused.

        With rank-0 loading every rank's model then goes to the meta device: ``fully_shard``
        never places a full copy on the device, and each rank materialises its shards only.
        A meta model on rank 0 is refused by :func:`distribute_from_rank0` on every rank at
        once (raising here on rank 0 alone would leave the others waiting for it)."""
        if not self.plugin.cpu_ram_efficient_loading:
            refuse_meta_model(model, self.name)
            return None
        state = capture_full_state(model) if self.ctx.is_main_process else {}
        to_meta(model)
        return state

    def _broadcast_from_rank0(self, model: nn.Module) -> None:
        """Start every rank from rank 0's parameters and buffers, as DDP does."""
        if not self.ctx.is_distributed:
            return
        device = self.ctx.device if self.place else None
        for tensor in (*model.parameters(), *model.buffers()):
            local = tensor.data
            data = local if device is None or local.device == device else local.to(device)
            dist.broadcast(data, src=0)  # nccl needs it on the GPU; placement follows anyway
            if data is not local:
                local.copy_(data)

    def _load_from_rank0(self, model: nn.Module, full_state: dict[str, torch.Tensor]) -> None:
        """Rank 0 sends each rank its own shards (no rank but 0 holds a full parameter)."""
        device = torch.device("cpu") if self.plugin.cpu_offload else self.ctx.device
        distribute_from_rank0(model, full_state=full_state if self.ctx.is_main_process else None,
                              ctx=self.ctx, device=device)

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Refuse an optimizer that already holds state: it was made for the unsharded
        parameters (also with ``cpu_offload``, where it must live on the CPU shards)."""
        if optimizer.state:
            offload = " and offloaded to the CPU" if self.plugin.cpu_offload else ""
            raise ValueError(f"{type(optimizer).__name__} already has state (it stepped, or "
                             f"loaded a state dict, before prepare()); FSDP shards{offload} the "
                             "parameters, so that state no longer fits them. Create the "
                             "optimizer, prepare() it with the model, and step or load_state() "
                             "after that")

    # -- gradient synchronisation ----------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return _gradient_sync(model, sync=False)

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return _gradient_sync(model, sync=True)

    # -- clipping --------------------------------------------------------------------------------
    def clip_grad_norm_(self, parameters: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor:
        """The norm over every shard of every rank (a plain tensor, the same on each rank)."""
        params = [p for p in parameters if p.grad is not None]
        norm = nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        full = getattr(norm, "full_tensor", None)
        return full() if full is not None else norm

    # -- state dicts ---------------------------------------------------------------------------
    def state_module(self, model: nn.Module) -> nn.Module:
        return self.unwrap(model)

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full state, gathered one tensor at a time onto rank 0's CPU (``{}`` elsewhere);
        every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state: dict[str, Any] = get_model_state_dict(self.unwrap(model), options=options)
        return state

    def load_model_state_dict(self, model: nn.Module, *, state: dict[str, torch.Tensor],
                              strict: bool = True) -> Any:
        """Load a full state dict held by rank 0 (other ranks may pass ``{}``); each rank
        keeps its shards."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                   strict=strict)
        return set_model_state_dict(self.unwrap(model), dict[str, Any](state), options=options)


def _average_ignored_gradients(model: nn.Module, ignored: set[nn.Parameter], world: int
                               ) -> None:
    """Average the gradients of trainable ``ignored_modules`` parameters over the ranks in the
    backward passes that synchronise (FSDP neither shards nor reduces them; left alone, the
    ranks' copies would drift apart)."""
    trainable = [p for p in ignored if p.requires_grad]
    if world == 1 or not trainable:
        return

    def hook(param: torch.Tensor) -> None:
        if param.grad is not None and getattr(model, _SYNC_ATTR, True):
            dist.all_reduce(param.grad)
            param.grad.div_(world)
    for p in trainable:
        p.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _gradient_sync(model: nn.Module, *, sync: bool) -> Iterator[None]:
    """Reduce-scatter gradients in the backward passes of the block, or not (accumulation);
    the setting before the block is restored after it (blocks nest)."""
    root = _fsdp_root(model)
    if root is None:
        yield
        return
    before = bool(getattr(root, _SYNC_ATTR, True))
    root.set_requires_gradient_sync(sync)
    setattr(root, _SYNC_ATTR, sync)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(before)
        setattr(root, _SYNC_ATTR, before)


#: where the root module remembers its gradient-sync setting (FSDP2 has no getter for it)
_SYNC_ATTR = "_accel_requires_gradient_sync"
