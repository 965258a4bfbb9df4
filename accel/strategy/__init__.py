"""Model-wrapping strategies, one file per implementation of :class:`Strategy`.

``select_strategy`` is the only place that branches on world size and device kind.
"""

from __future__ import annotations

from .._base.warn import warn_user
from ..config.fsdp import FullyShardedDataParallelPlugin
from ..config.parallelism import ParallelismConfig, refuse_model_parallel
from ..config.settings import DistributedDataParallelKwargs, PrecisionType
from ..distributed import ProcessContext
from .base import Strategy, no_join, strip_parallel, unwrap_module
from .ddp import DDPStrategy
from .fsdp import FSDPStrategy, MeshHolder
from .single import SingleDeviceStrategy
from .xla import XLAStrategy

__all__ = ["DDPStrategy", "FSDPStrategy", "SingleDeviceStrategy", "Strategy", "XLAStrategy",
           "no_join", "select_strategy", "strip_parallel", "unwrap_module"]


def select_strategy(ctx: ProcessContext, *, place: bool = True,
                    ddp_kwargs: DistributedDataParallelKwargs | None = None,
                    fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
                    parallelism: ParallelismConfig | None = None,
                    precision: PrecisionType = PrecisionType.NO) -> Strategy:
    """A job with an FSDP plugin (or a mesh that shards) gets FSDP; XLA devices the XLA
    strategy; other multi-process jobs DDP; else a single device.

    Raises:
        ValueError: an FSDP plugin with an XLA device, or a mesh that does not fit the job.

    An FSDP plugin on one process (debugging on a laptop, resuming a sharded checkpoint on one
    process) runs FSDP2 on a one-device mesh, with one warning.
    """
    if parallelism is not None:
        refuse_model_parallel(parallelism)
    shards = parallelism is not None and \
        parallelism.mesh_shape(ctx.world_size, ctx.local_world_size)[1] > 1
    if fsdp_plugin is not None or shards:
        return _fsdp(ctx, place=place, ddp_kwargs=ddp_kwargs, plugin=fsdp_plugin,
                     parallelism=parallelism, precision=precision)
    if ctx.device.type == "xla":
        return XLAStrategy(ctx, place, ddp_kwargs)
    if ctx.is_distributed:
        return DDPStrategy(ctx, place, ddp_kwargs)
    return SingleDeviceStrategy(ctx, place, ddp_kwargs)


def _fsdp(ctx: ProcessContext, *, place: bool, ddp_kwargs: DistributedDataParallelKwargs | None,
          plugin: FullyShardedDataParallelPlugin | None, parallelism: ParallelismConfig | None,
          precision: PrecisionType) -> Strategy:
    if ctx.device.type == "xla":
        raise ValueError("FSDP (fsdp_plugin) runs on CPU and CUDA devices; on XLA drop the "
                         "plugin (accel uses torch_xla's data parallelism) or use device='cuda'")
    if not ctx.is_distributed and parallelism is None:
        # Accelerate ignores the plugin on one process; accel keeps FSDP2 on a one-device mesh
        # so the script runs the same code path and reads and writes the same checkpoints
        # (a sharded one written by N processes is resharded by DCP).
        warn_user("FSDP on one process: the model is not sharded (FSDP2 on a one-device "
                  "mesh, same checkpoint format); launch several processes to shard it "
                  "(accel launch --num_processes N --use_fsdp script.py), or pass "
                  "parallelism_config=ParallelismConfig(dp_shard_size=1) to run one "
                  "process on purpose without this warning")
        parallelism = ParallelismConfig(dp_shard_size=1)
    plugin = plugin or FullyShardedDataParallelPlugin()
    if parallelism is None:  # FSDP1's FULL_SHARD asks for sharding across every rank
        parallelism = ParallelismConfig(dp_replicate_size=1 if plugin.hybrid is False else None)
    parallelism.mesh_shape(ctx.world_size, ctx.local_world_size)  # raises if it does not fit
    return FSDPStrategy(ctx, place, ddp_kwargs, plugin, MeshHolder(parallelism=parallelism),
                        precision)
