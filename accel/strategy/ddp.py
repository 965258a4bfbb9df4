"""DistributedDataParallel over gloo (CPU) or nccl (CUDA)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from torch import nn

from ..config.settings import DDPCommunicationHookType, DistributedDataParallelKwargs
from .base import Strategy, SyncSetting, strip_compile

__all__ = ["DDPStrategy"]

_DDP = nn.parallel.DistributedDataParallel


class DDPStrategy(Strategy):
    name = "ddp"
    replicates_model = True

    def wrap_model(self, model: nn.Module, sync_batchnorm: SyncSetting = False) -> nn.Module:
        model = self._convert_and_place(model, sync_batchnorm)
        if not any(p.requires_grad for p in model.parameters()):
            return model  # frozen (e.g. a teacher): DDP would refuse it, and nothing to sync
        kwargs = self.ddp_kwargs.to_kwargs()
        if self.ctx.device.type == "cuda":
            kwargs.update(device_ids=[self.ctx.device.index], output_device=self.ctx.device.index)
        wrapped = _DDP(model, **kwargs)
        _register_comm_hook(wrapped, self.ddp_kwargs)
        return wrapped

    # A model that prepare() compiled is torch.compile(DDP(model)): the DDP is inside it.
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        model = strip_compile(model)
        if isinstance(model, _DDP):
            return model.no_sync()
        return contextlib.nullcontext()

    def trigger_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        model = strip_compile(model)
        if not isinstance(model, _DDP):
            return contextlib.nullcontext()
        return _forced_sync(model)

    @property
    def joins_uneven_inputs(self) -> bool:
        return self.ctx.is_distributed

    def join(self, joinables: Iterable[Any], *, enable: bool = True
             ) -> contextlib.AbstractContextManager[Any]:
        from torch.distributed.algorithms.join import Join, Joinable

        # DDP models (also inside a compile wrapper), and any other torch Joinable (a
        # ZeroRedundancyOptimizer); other objects (an optimizer wrapper, a model DDP did not
        # wrap) have nothing to shadow.
        inner = [strip_compile(j) if isinstance(j, nn.Module) else j for j in joinables]
        joining: list[Joinable] = [j for j in inner if isinstance(j, Joinable)]
        if not self.ctx.is_distributed or not joining:
            return contextlib.nullcontext()
        return Join(joining, enable=enable, throw_on_early_termination=False)


def _register_comm_hook(model: nn.parallel.DistributedDataParallel,
                        options: DistributedDataParallelKwargs) -> None:
    """Register ``options.comm_hook`` (wrapped by ``comm_wrapper``) on a fresh DDP model."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    kind = DDPCommunicationHookType
    if options.comm_hook is kind.NO:
        return
    hooks: dict[DDPCommunicationHookType, Any] = {
        kind.FP16: default_hooks.fp16_compress_hook,
        kind.BF16: default_hooks.bf16_compress_hook,
        kind.POWER_SGD: powerSGD_hook.powerSGD_hook,
        kind.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {kind.FP16: default_hooks.fp16_compress_wrapper,
                kind.BF16: default_hooks.bf16_compress_wrapper}
    hook = hooks[options.comm_hook]
    if options.comm_wrapper in wrappers:
        hook = wrappers[options.comm_wrapper](hook)
    state: Any = None  # the default hooks take the process group (None: the default one)
    if options.comm_hook in (kind.POWER_SGD, kind.BATCHED_POWER_SGD):
        try:
            state = powerSGD_hook.PowerSGDState(None, **options.comm_state_option)
        except TypeError as exc:
            raise TypeError(f"comm_state_option={options.comm_state_option!r} does not fit "
                            f"PowerSGDState ({exc}); pass its keyword arguments, e.g. "
                            "{'matrix_approximation_rank': 2}") from None
    model.register_comm_hook(state=state, hook=hook)


@contextlib.contextmanager
def _forced_sync(model: nn.parallel.DistributedDataParallel) -> Iterator[None]:
    """The next backward all-reduces, even when its forward ran under ``no_sync``.

    DDP arms its reducer in a forward run outside ``no_sync``; a forward inside it leaves the
    reducer's gradient hooks idle, so setting the flags alone syncs nothing. Arming the reducer
    here (as Accelerate's ``trigger_sync_in_backward`` does) makes the backward run in this block
    all-reduce every gradient, including those accumulated locally before it.
    """
    old_backward, old_forward = model.require_backward_grad_sync, model.require_forward_param_sync
    model.require_backward_grad_sync = model.require_forward_param_sync = True
    model.reducer.prepare_for_backward([])
    try:
        yield
    finally:
        model.require_backward_grad_sync = old_backward
        model.require_forward_param_sync = old_forward
