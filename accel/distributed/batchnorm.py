"""SyncBatchNorm on every device: ``torch.nn.SyncBatchNorm`` plus a path for CPU tensors.

torch's ``SyncBatchNorm`` refuses CPU inputs in training ("SyncBatchNorm expected input tensor
to be on GPU ..."): its kernels exist for CUDA-like devices only, and DDP refuses the class in
CPU modules. accel's :class:`SyncBatchNorm` runs torch's path on those devices and, elsewhere
(CPU over gloo), computes the statistics of the whole group itself: one all-reduce of
per-channel sums, sums of squares and counts (in float64) in forward, one of the two gradient
sums in backward, so that outputs, running statistics and gradients equal those of ``BatchNorm``
over the group's concatenated batch. Weight and bias gradients stay local, as in torch: DDP
averages them.

:func:`convert_sync_batchnorm` turns a model's BatchNorm layers into ``torch.nn.SyncBatchNorm``
on CUDA-like devices and into accel's class elsewhere; layers synchronised already keep their
group.

Example:
    >>> import torch
    >>> model = convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    >>> type(model[0]).__module__
    'accel.distributed.batchnorm'
    >>> model(torch.randn(4, 3)).shape  # no process group: plain BatchNorm
    torch.Size([4, 3])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import FunctionCtx

__all__ = ["MODES", "BatchNormSync", "SyncBatchNorm", "convert_sync_batchnorm", "parse_mode"]

#: the statistics of one SyncBatchNorm span all processes, or those of this rank's machine
MODES = ("global", "node")
_ALIASES = {"global": "global", "true": "global", "node": "node", "local": "node"}


def parse_mode(value: bool | str | None, what: str = "sync_batchnorm") -> str | None:
    """``"global"``, ``"node"`` or None (off) from True/False/None or a mode name.

    ``True`` is ``"global"``; ``"local"`` (the name some vendor Horovod builds use) is
    ``"node"``.

    Example:
        >>> parse_mode(True), parse_mode("Node"), parse_mode("local"), parse_mode(False)
        ('global', 'node', 'node', None)
    """
    if value is None or value is False:
        return None
    if value is True:
        return "global"
    if isinstance(value, str) and value.strip().lower() in _ALIASES:
        return _ALIASES[value.strip().lower()]
    raise ValueError(f"{what}={value!r} is not a SyncBatchNorm mode; use 'global' (statistics "
                     "over all processes, or True), 'node' (over the processes of each machine) "
                     "or False (each process normalises its own batch)")


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchNormSync:
    """What ``prepare()`` does to BatchNorm layers: the mode and the group it resolved to."""

    mode: str = "global"
    #: the torch process group (None: the default group, i.e. every process)
    group: Any = None


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None,
                           device: torch.device | str | None = None) -> nn.Module:
    """``module`` with its BatchNorm layers synchronised over ``process_group`` (None: all
    processes), for training on ``device`` (None: where ``module`` is).

    On devices torch's SyncBatchNorm kernels support (CUDA, XPU, HPU) the layers become
    ``torch.nn.SyncBatchNorm``; elsewhere (CPU) accel's :class:`SyncBatchNorm` (torch's class
    refuses CPU tensors, and DDP refuses it in CPU modules). Layers that are synchronised
    already keep their group; a ``torch.nn.SyncBatchNorm`` bound for the CPU becomes accel's
    (same group) so that it can train there. Parameters and buffers are shared with the
    replaced layers, as torch's ``convert_sync_batchnorm`` does.
    """
    kind = torch.device(device).type if device is not None else _device_type(module)
    torch_kernels = kind in _torch_kernel_devices()
    out = module
    if isinstance(module, SyncBatchNorm) or (isinstance(module, nn.SyncBatchNorm)
                                             and torch_kernels):
        return module
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        group = module.process_group if isinstance(module, nn.SyncBatchNorm) else process_group
        cls = nn.SyncBatchNorm if torch_kernels else SyncBatchNorm
        out = cls(module.num_features, module.eps, module.momentum, module.affine,
                  module.track_running_stats, group, bias=module.bias is not None)
        if module.affine:
            out.weight, out.bias = module.weight, module.bias
        out.running_mean, out.running_var = module.running_mean, module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.train(module.training)
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group, kind))
    return out


def _device_type(module: nn.Module) -> str:
    first: torch.Tensor | None = next(iter(module.parameters()), None)
    if first is None:
        first = next(iter(module.buffers()), None)
    return "cpu" if first is None else first.device.type


def _torch_kernel_devices() -> tuple[str, ...]:
    """Device types torch's SyncBatchNorm kernels accept (its own list)."""
    return ("cuda", "hpu", "xpu", torch._C._get_privateuse1_backend_name())


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """``torch.nn.SyncBatchNorm``'s layer (same arguments and semantics) that also trains on
    CPU and other devices torch's kernels refuse.

    ``process_group``: None = all processes. In training, with a process group of more than one
    process, the batch statistics are those of the group's concatenated batch; in eval mode the
    running statistics are used, as in torch. On CUDA-like devices torch's kernels run.
    It is not a ``torch.nn.SyncBatchNorm`` subclass: DDP refuses those in CPU modules.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device: Any = None, dtype: Any = None, *,
                 bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype, bias=bias)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _check_non_zero_input_channels(self, input: torch.Tensor) -> None:
        if input.size(1) == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.device.type in _torch_kernel_devices():
            out: torch.Tensor = cast(Any, nn.SyncBatchNorm).forward(self, input)
            return out  # torch's own path (this class has every attribute it reads)
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        if self._group_size() <= 1:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        running_mean = running_var = None
        if self.track_running_stats:
            assert self.num_batches_tracked is not None  # track_running_stats made it
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
            running_mean, running_var = self.running_mean, self.running_var
        out = _GroupBatchNorm.apply(  # type: ignore[no-untyped-call]
            input, self.weight, self.bias, running_mean, running_var, self.eps, factor,
            self.process_group)
        return out

    def _group_size(self) -> int:
        """Processes to synchronise with (0: eval mode or no process group: plain BatchNorm)."""
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return 0
        return int(dist.get_world_size(self.process_group))


def _channel_shape(x: torch.Tensor) -> list[int]:
    return [1, x.size(1)] + [1] * (x.dim() - 2)


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


class _GroupBatchNorm(torch.autograd.Function):
    """Batch normalisation over the concatenated batch of a process group (any device)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, eps: float, factor: float,
                group: Any) -> torch.Tensor:
        x = x.contiguous()
        dims, shape = _reduce_dims(x), _channel_shape(x)
        local = torch.tensor([x.numel() // max(x.size(1), 1)], dtype=torch.float64,
                             device=x.device)
        stats = torch.cat([x.sum(dims, dtype=torch.float64),
                           x.square().sum(dims, dtype=torch.float64), local])
        dist.all_reduce(stats, group=group)
        channels = x.size(1)
        total = float(stats[-1].item())
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{int(total)} over the process group (input size "
                             f"{list(x.shape)} here)")
        mean = stats[:channels] / total
        var = (stats[channels:2 * channels] / total - mean.square()).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
            unbiased = var * (total / (total - 1))
            running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)
        mean_x, invstd_x = mean.to(x.dtype).view(shape), invstd.to(x.dtype).view(shape)
        out = (x - mean_x) * invstd_x
        if weight is not None:
            out = out * weight.to(x.dtype).view(shape)
        if bias is not None:
            out = out + bias.to(x.dtype).view(shape)
        ctx.save_for_backward(x, cast(torch.Tensor, weight), mean_x, invstd_x)
        ctx.group, ctx.total = group, total  # type: ignore[attr-defined]
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: torch.Tensor) -> tuple[Any, ...]:
        dy = grads[0].contiguous()
        x, weight, mean, invstd = ctx.saved_tensors  # type: ignore[attr-defined]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]  # type: ignore[attr-defined]
        group, total = ctx.group, ctx.total  # type: ignore[attr-defined]
        dims, shape = _reduce_dims(x), _channel_shape(x)
        xmu = x - mean
        sum_dy = dy.sum(dims, dtype=torch.float64)
        sum_dy_xmu = (dy * xmu).sum(dims, dtype=torch.float64)
        grad_w = (sum_dy_xmu * invstd.view(-1)).to(weight.dtype) \
            if need_w and weight is not None else None
        grad_b = sum_dy.to(dy.dtype) if need_b else None
        grad_x = None
        if need_x:
            sums = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(sums, group=group)
            channels = x.size(1)
            mean_dy = (sums[:channels] / total).to(x.dtype).view(shape)
            mean_dy_xmu = (sums[channels:] / total).to(x.dtype).view(shape)
            scale = invstd if weight is None else invstd * weight.to(x.dtype).view(shape)
            grad_x = (dy - mean_dy - xmu * invstd.square() * mean_dy_xmu) * scale
        return grad_x, grad_w, grad_b, None, None, None, None, None
