"""Resolve Accelerator settings from constructor arguments, ``ACCEL_*`` variables and defaults.

Precedence: constructor argument > ``ACCEL_*`` environment (written by ``accel launch`` from its
flags and config file) > default. When a constructor argument disagrees with the environment
the constructor wins and one warning says so; an invalid value anywhere is an error.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .config import (AutocastKwargs, DistributedDataParallelKwargs, GradientAccumulationPlugin,
                     GradScalerKwargs, InitProcessGroupKwargs, KwargsHandler, PrecisionType,
                     parse_mixed_precision, to_timedelta)
from .env import EnvSettings
from .tracking import check_log_with

__all__ = ["check_argument_types", "Handlers", "resolve_accumulation", "resolve_precision", "resolve_timeout",
           "sort_handlers", "UNSUPPORTED_ARGUMENTS"]

#: Accelerate constructor arguments that accel does not implement, and what to do instead.
UNSUPPORTED_ARGUMENTS = {
    "deepspeed_plugin": "DeepSpeed is not supported; use DDP (the default) or FSDP directly",
    "deepspeed_plugins": "DeepSpeed is not supported; use DDP (the default)",
    "fsdp_plugin": "FSDP is not supported yet; wrap the model with torch FSDP yourself",
    "megatron_lm_plugin": "Megatron-LM is not supported",
    "torch_tp_plugin": "tensor parallelism is not supported",
    "dynamo_backend": "call torch.compile(model) yourself before prepare()",
    "dynamo_plugin": "call torch.compile(model) yourself before prepare()",
    "split_batches": "pass dataloader_config=DataLoaderConfiguration(split_batches=...)",
    "dispatch_batches": "accel never dispatches batches from rank 0; drop the argument",
    "even_batches": "pass dataloader_config=DataLoaderConfiguration(even_batches=...)",
    "use_seedable_sampler": "pass dataloader_config=DataLoaderConfiguration(...)",
}


@dataclass
class Handlers:
    ddp: DistributedDataParallelKwargs | None = None
    scaler: GradScalerKwargs | None = None
    init: InitProcessGroupKwargs | None = None
    autocast: AutocastKwargs | None = None


def sort_handlers(handlers: list[KwargsHandler] | None) -> Handlers:
    """Sort kwargs handlers by kind; a duplicate kind or an unknown object is an error."""
    out = Handlers()
    slots = {DistributedDataParallelKwargs: "ddp", GradScalerKwargs: "scaler",
             InitProcessGroupKwargs: "init", AutocastKwargs: "autocast"}
    for handler in handlers or []:
        slot = slots.get(type(handler))
        if slot is None:
            raise TypeError(
                f"kwargs_handlers got {type(handler).__name__}; expected instances of "
                f"{', '.join(cls.__name__ for cls in slots)}"
            )
        if getattr(out, slot) is not None:
            raise ValueError(f"kwargs_handlers has two {type(handler).__name__}; pass one")
        setattr(out, slot, handler)
    return out


def _disagree(name: str, ctor: Any, env_name: str, env_value: Any) -> None:
    warnings.warn(f"Accelerator({name}={ctor!r}) overrides {env_name}={env_value!r} set by "
                  f"`accel launch`; using {ctor!r}", stacklevel=4)


def resolve_precision(ctor: str | None, settings: EnvSettings) -> PrecisionType:
    env = parse_mixed_precision(settings.mixed_precision) if settings.mixed_precision else None
    if ctor is None:
        return env or PrecisionType.NO
    chosen = parse_mixed_precision(ctor)
    if env is not None and env is not chosen:
        _disagree("mixed_precision", chosen.value, "ACCEL_MIXED_PRECISION", env.value)
    return chosen


def resolve_accumulation(steps: int | None, plugin: GradientAccumulationPlugin | None,
                         settings: EnvSettings) -> GradientAccumulationPlugin:
    if steps is not None and plugin is not None:
        raise ValueError("pass either gradient_accumulation_steps or "
                         "gradient_accumulation_plugin, not both")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {steps!r}")
        plugin = GradientAccumulationPlugin(num_steps=steps)
    env_steps = settings.gradient_accumulation_steps
    if plugin is None:
        return GradientAccumulationPlugin(num_steps=env_steps or 1)
    if plugin.num_steps is None:
        plugin.num_steps = env_steps or 1
    elif env_steps is not None and env_steps != plugin.num_steps:
        _disagree("gradient_accumulation_steps", plugin.num_steps,
                  "ACCEL_GRADIENT_ACCUMULATION_STEPS", env_steps)
    return plugin


def resolve_timeout(ctor: float | timedelta | None, handler: InitProcessGroupKwargs | None,
                    settings: EnvSettings) -> timedelta | None:
    from_ctor = to_timedelta(ctor, "timeout")
    from_handler = to_timedelta(handler.timeout, "InitProcessGroupKwargs.timeout") \
        if handler is not None else None
    if from_ctor is not None and from_handler is not None and from_ctor != from_handler:
        raise ValueError(f"timeout={ctor!r} and InitProcessGroupKwargs(timeout="
                         f"{handler.timeout!r}) disagree; pass one of them")  # type: ignore[union-attr]
    chosen = from_ctor or from_handler
    env = to_timedelta(settings.timeout, "ACCEL_TIMEOUT")
    if chosen is not None and env is not None and chosen != env:
        _disagree("timeout", chosen.total_seconds(), "ACCEL_TIMEOUT", env.total_seconds())
    return chosen or env


def check_argument_types(cpu: Any, device_placement: Any, project_dir: Any, log_with: Any,
                         step_scheduler_with_optimizer: Any) -> None:
    """Reject wrong types early (``cpu="yes"`` would otherwise be truthy and silently apply)."""
    for name, value in (("cpu", cpu), ("device_placement", device_placement),
                        ("step_scheduler_with_optimizer", step_scheduler_with_optimizer)):
        if not isinstance(value, bool):
            raise TypeError(f"Accelerator({name}=...) must be True or False, got {value!r}")
    if project_dir is not None and not isinstance(project_dir, (str, os.PathLike)):
        raise TypeError(f"Accelerator(project_dir=...) must be a path, got {project_dir!r}")
    check_log_with(log_with)
