"""Turn ``Accelerator(...)`` arguments into a frozen runtime: the one place settings resolve.

Precedence: constructor argument > ``ACCEL_*`` environment (written by ``accel launch`` from its
flags and its config file, so a config file reaches workers through it) > default. When a
constructor argument disagrees with the environment the constructor wins and one warning says
so; an invalid value anywhere is an error that names the fix.

:func:`connect` validates the arguments, reads the environment once, picks the device, starts
(or adopts) the process group and builds the collaborators every later call shares: the
communicator, the stall monitor, the precision policy and the strategy. Nothing here keeps
state between calls; two ``Accelerator`` objects get two runtimes.

Example:
    >>> options, runtime = connect(Arguments(cpu=True, mixed_precision="bf16"))
    >>> runtime.precision.mode.value, runtime.strategy.name
    ('bf16', 'single')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

from .. import env
from .._base.parse import parse_int
from .._base.warn import warn_user
from ..config.fsdp import (
    LAUNCH_FSDP,
    LAUNCH_PARALLELISM,
    FullyShardedDataParallelPlugin,
    parallelism_from_launch,
    plugin_from_launch,
)
from ..config.parallelism import ParallelismConfig
from ..config.settings import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    PrecisionType,
    ProjectConfiguration,
    parse_mixed_precision,
    to_timedelta,
)
from ..device import Device, select_device
from ..distributed import (
    Communicator,
    ProcessContext,
    ProcessGroupHandle,
    build_context,
    start_process_group,
)
from ..distributed.batchnorm import BatchNormSync, parse_mode
from ..distributed.debug import consistency_check
from ..distributed.health.attendance import Attendance
from ..distributed.health.stall import CollectiveMonitor
from ..distributed.nodes import node_group
from ..precision import Precision, make_precision
from ..strategy import Strategy, select_strategy
from ..strategy.compile import DynamoBackend, TorchDynamoPlugin
from ..tracking.trackers import check_log_with
from .rng import RNG_TYPES

__all__ = ["Arguments", "Handlers", "Options", "ProcessSetup", "Runtime", "connect",
            "connect_process", "resolve_dynamo", "resolve_precision", "resolve_sharding",
           "resolve_sync_batchnorm", "sort_handlers"]

_RNG_TYPES = RNG_TYPES
#: plugin fields whose effect lives in other fields once normalised
_EFFECTS = {"sharding_strategy": ("reshard_after_forward", "hybrid")}
_Config = TypeVar("_Config", FullyShardedDataParallelPlugin, ParallelismConfig)
_V = TypeVar("_V")


@dataclass(frozen=True, kw_only=True, slots=True)
class Arguments:
    """``Accelerator(...)``'s arguments as given (names and defaults are Accelerate's)."""

    device_placement: bool = True
    mixed_precision: str | PrecisionType | None = None
    gradient_accumulation_steps: int | None = None
    cpu: bool = False
    device: str | None = None
    dataloader_config: DataLoaderConfiguration | None = None
    project_dir: str | os.PathLike[str] | None = None
    project_config: ProjectConfiguration | None = None
    gradient_accumulation_plugin: GradientAccumulationPlugin | None = None
    rng_types: list[str] | None = None
    log_with: Any = None
    step_scheduler_with_optimizer: bool = True
    kwargs_handlers: list[KwargsHandler] | None = None
    timeout: float | timedelta | None = None
    sync_batchnorm: bool | str | None = None
    dynamo_backend: DynamoBackend | str | None = None
    dynamo_plugin: TorchDynamoPlugin | None = None
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None
    parallelism_config: ParallelismConfig | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Handlers:
    """``kwargs_handlers`` sorted by kind (at most one of each)."""

    ddp: DistributedDataParallelKwargs | None = None
    scaler: GradScalerKwargs | None = None
    init: InitProcessGroupKwargs | None = None
    autocast: AutocastKwargs | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Options:
    """The user's choices after validation and resolution; what the facade exposes."""

    device_placement: bool
    precision_mode: PrecisionType
    accumulation: GradientAccumulationPlugin
    dataloader_config: DataLoaderConfiguration
    project: ProjectConfiguration
    rng_types: list[str]
    log_with: Any
    step_scheduler_with_optimizer: bool
    #: "global", "node" or None (BatchNorm layers left alone)
    sync_batchnorm: str | None
    autocast: AutocastKwargs
    dynamo_plugin: TorchDynamoPlugin
    #: FSDP2 settings (None: data parallelism with DDP) and the device mesh of a sharded run
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None
    parallelism_config: ParallelismConfig | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessSetup:
    """This process's place in the job: what ``PartialState`` needs, and the base of a runtime."""

    settings: env.EnvSettings
    launch: env.LaunchInfo
    hardware: Device
    context: ProcessContext
    group: ProcessGroupHandle


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    """What one ``Accelerator`` runs on; built once by :func:`connect`, never replaced."""

    settings: env.EnvSettings
    launch: env.LaunchInfo
    hardware: Device
    context: ProcessContext
    group: ProcessGroupHandle
    monitor: CollectiveMonitor
    comm: Communicator
    precision: Precision
    strategy: Strategy
    #: who takes part in save_state (None at world size 1 or without a store); with a strategy
    #: whose state is sharded (FSDP), a save_state on the main process alone is refused at once
    attendance: Attendance | None = None
    #: what prepare() does to BatchNorm layers (None: nothing); in "node" mode it holds this
    #: rank's node group, created once here (collectively) and owned by this runtime
    batchnorm: BatchNormSync | None = None

    @property
    def timeout(self) -> timedelta:
        return self.group.timeout


def connect(args: Arguments) -> tuple[Options, Runtime]:
    """Validate ``args``, resolve them against the environment, and build the runtime.

    Raises:
        TypeError: an unsupported argument or a value of the wrong type (naming the fix).
        ValueError: an invalid or contradictory value (naming the fix).
    """
    _check_arguments(args)
    settings = env.read_settings()
    handlers = sort_handlers(args.kwargs_handlers)
    options = _resolve_options(args, settings, handlers)
    # Resolve everything that can fail before touching process-wide state.
    timeout = _resolve_timeout(args.timeout, handlers.init, settings)
    process = _start_process(settings, device=args.device, cpu=args.cpu, init=handlers.init,
                             timeout=timeout,
                             single=options.parallelism_config is not None
                             or options.fsdp_plugin is not None)
    if process.context.is_main_process:
        _warn_dynamo(options.dynamo_plugin, settings)
    return options, _build_runtime(process, options, handlers)


def connect_process(cpu: bool = False, *, init: InitProcessGroupKwargs | None = None
                    ) -> ProcessSetup:
    """Only the process part of :func:`connect`: device, context and process group.

    The path ``PartialState`` takes: the same resolution as ``Accelerator(cpu=..., kwargs_handlers=
    [init])``, so an ``Accelerator`` created later adopts the group started here (and a group
    that already exists, from an ``Accelerator`` or the user, is adopted here).

    Example:
        >>> connect_process(cpu=True).context.world_size
        1
    """
    if not isinstance(cpu, bool):
        raise TypeError(f"cpu must be True or False, got {cpu!r}")
    settings = env.read_settings()
    timeout = _resolve_timeout(None, init, settings)
    return _start_process(settings, device=None, cpu=cpu, init=init, timeout=timeout)


def _start_process(settings: env.EnvSettings, *, device: str | None, cpu: bool,
                   init: InitProcessGroupKwargs | None, timeout: timedelta | None,
                   single: bool = False) -> ProcessSetup:
    """``single``: start a process group also for one process (FSDP's one-device mesh)."""
    if settings.num_threads is not None and torch.get_num_threads() != settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    info = env.detect_launch()
    hardware = select_device(device, cpu=cpu, settings=settings)
    ctx = build_context(info, hardware)
    group = start_process_group(ctx, info=info, device=hardware, timeout=timeout,
                                backend=init.backend if init else None,
                                init_method=init.init_method if init else None, single=single)
    return ProcessSetup(settings=settings, launch=info, hardware=hardware, context=ctx, group=group)


def _build_runtime(process: ProcessSetup, options: Options, handlers: Handlers) -> Runtime:
    settings, info, ctx, group = process.settings, process.launch, process.context, process.group
    monitor = CollectiveMonitor(ctx.rank, ctx.world_size, group.store(), settings.stall_seconds,
                                group.timeout, attempt=info.restart_count)
    comm = Communicator(ctx, [monitor, *([consistency_check] if settings.debug else [])])
    precision = make_precision(options.precision_mode, device=ctx.device,
                               autocast=options.autocast, scaler_kwargs=handlers.scaler,
                               hardware=process.hardware)
    strategy = select_strategy(ctx, place=options.device_placement, ddp_kwargs=handlers.ddp,
                               fsdp_plugin=options.fsdp_plugin,
                               parallelism=options.parallelism_config,
                               precision=options.precision_mode)
    attendance = Attendance(monitor, timeout=group.timeout) \
        if ctx.is_distributed and monitor.store is not None else None
    return Runtime(settings=settings, launch=info, hardware=process.hardware, context=ctx,
                   group=group, monitor=monitor, comm=comm, precision=precision, strategy=strategy,
                   attendance=attendance, batchnorm=_batchnorm_sync(options.sync_batchnorm, ctx))


def _batchnorm_sync(mode: str | None, ctx: ProcessContext) -> BatchNormSync | None:
    """The mode and group of SyncBatchNorm; "node" creates the node groups (collective)."""
    if mode is None:
        return None
    return BatchNormSync(mode=mode, group=node_group(ctx) if mode == "node" else None)


# -- validation ------------------------------------------------------------------------------
def _check_arguments(args: Arguments) -> None:
    """Reject wrong types early (``cpu="yes"`` would otherwise be truthy and silently apply)."""
    for name in ("cpu", "device_placement", "step_scheduler_with_optimizer"):
        value = getattr(args, name)
        if not isinstance(value, bool):
            raise TypeError(f"Accelerator({name}=...) must be True or False, got {value!r}")
    if args.project_dir is not None and not isinstance(args.project_dir, (str, os.PathLike)):
        raise TypeError(f"Accelerator(project_dir=...) must be a path, got {args.project_dir!r}")
    if args.dataloader_config is not None and \
            not isinstance(args.dataloader_config, DataLoaderConfiguration):
        raise TypeError("dataloader_config must be a DataLoaderConfiguration")
    for item in args.rng_types or []:
        if item not in _RNG_TYPES:
            raise ValueError(f"unknown rng type {item!r}; expected some of {_RNG_TYPES}")
    check_log_with(args.log_with, logging_dir=_resolve_project(
        args.project_dir, args.project_config).logging_dir)


def sort_handlers(handlers: list[KwargsHandler] | None) -> Handlers:
    """Sort kwargs handlers by kind; a duplicate kind or an unknown object is an error."""
    slots: dict[type[KwargsHandler], str] = {
        DistributedDataParallelKwargs: "ddp", GradScalerKwargs: "scaler",
        InitProcessGroupKwargs: "init", AutocastKwargs: "autocast"}
    found: dict[str, KwargsHandler] = {}
    for handler in handlers or []:
        slot = slots.get(type(handler))
        if slot is None:
            raise TypeError(
                f"kwargs_handlers got {type(handler).__name__}; expected instances of "
                f"{', '.join(cls.__name__ for cls in slots)}"
            )
        if slot in found:
            raise ValueError(f"kwargs_handlers has two {type(handler).__name__}; pass one")
        found[slot] = handler
    return Handlers(**found)  # type: ignore[arg-type]


# -- resolution --------------------------------------------------------------------------------
def _resolve_options(args: Arguments, settings: env.EnvSettings, handlers: Handlers) -> Options:
    return Options(
        device_placement=args.device_placement,
        precision_mode=resolve_precision(args.mixed_precision, settings),
        accumulation=_resolve_accumulation(args.gradient_accumulation_steps,
                                           args.gradient_accumulation_plugin, settings),
        dataloader_config=args.dataloader_config or DataLoaderConfiguration(),
        project=_resolve_project(args.project_dir, args.project_config),
        rng_types=list(args.rng_types or []),
        log_with=args.log_with,
        step_scheduler_with_optimizer=args.step_scheduler_with_optimizer,
        sync_batchnorm=resolve_sync_batchnorm(args.sync_batchnorm, settings),
        autocast=handlers.autocast or AutocastKwargs(),
        dynamo_plugin=resolve_dynamo(args.dynamo_backend, args.dynamo_plugin),
        **resolve_sharding(args.fsdp_plugin, args.parallelism_config, settings),
    )


def resolve_sharding(plugin: FullyShardedDataParallelPlugin | None,
                     parallelism: ParallelismConfig | None,
                     settings: env.EnvSettings | None = None) -> dict[str, Any]:
    """``fsdp_plugin`` and ``parallelism_config``: as given, else (``ACCEL_USE_FSDP=1``) built
    from the ``ACCEL_FSDP_*`` and ``ACCEL_PARALLELISM_CONFIG_*`` settings of ``accel launch``.
    A given one that disagrees with those settings wins, with one warning naming them.

    Example:
        >>> found = env.EnvSettings(use_fsdp=True, fsdp_reshard_after_forward="false")
        >>> resolve_sharding(None, None, found)["fsdp_plugin"].reshard_after_forward
        False
    """
    if plugin is not None and not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise TypeError("fsdp_plugin must be a FullyShardedDataParallelPlugin, got "
                        f"{type(plugin).__name__}")
    if parallelism is not None and not isinstance(parallelism, ParallelismConfig):
        raise TypeError("parallelism_config must be a ParallelismConfig, got "
                        f"{type(parallelism).__name__}")
    if settings is not None and settings.use_fsdp:
        plugin = _from_env(plugin, values=settings.given("fsdp_"), fields=LAUNCH_FSDP,
                           argument="fsdp_plugin",
                           build=plugin_from_launch)
        parallelism = _from_env(parallelism, values=settings.given("parallelism_config_"),
                                fields=LAUNCH_PARALLELISM, argument="parallelism_config",
                                build=parallelism_from_launch) if parallelism is not None or \
            settings.given("parallelism_config_") else None
    return {"fsdp_plugin": plugin, "parallelism_config": parallelism}


def _from_env(given: _Config | None, *, values: dict[str, Any], fields: dict[str, str],
              argument: str, build: Callable[..., _Config]) -> _Config:
    """``given``, else what the ``ACCEL_*`` ``values`` build; warns once when ``given`` differs
    from them."""
    try:
        from_env = build(values, lambda name: f"ACCEL_{name.upper()}")
    except ValueError as exc:
        raise env.LaunchEnvironmentError(f"{exc}; fix the `accel launch` setting or unset the "
                                         "variable") from None
    if given is None:
        return from_env
    differ = [f"ACCEL_{name.upper()}={values[name]!r}" for name in values
              if any(getattr(given, item) != getattr(from_env, item)
                     for item in _EFFECTS.get(fields[name], (fields[name],)))]
    if differ:
        warn_user(f"Accelerator({argument}=...) overrides {', '.join(differ)} set by "
                  f"`accel launch`; using the {argument} given")
    return given


def resolve_dynamo(backend: DynamoBackend | str | None, plugin: TorchDynamoPlugin | None
                   ) -> TorchDynamoPlugin:
    """The compile settings: ``dynamo_plugin``, else ``TorchDynamoPlugin(backend=dynamo_backend)``
    (its other fields, or all of them without either, from ``ACCEL_DYNAMO_*``).

    Example:
        >>> resolve_dynamo("inductor", None).backend
        <DynamoBackend.INDUCTOR: 'INDUCTOR'>
    """
    if plugin is not None and backend is not None:
        raise ValueError("pass either dynamo_backend or dynamo_plugin, not both; e.g. "
                         "dynamo_plugin=TorchDynamoPlugin(backend=..., mode=...)")
    if plugin is None:
        return TorchDynamoPlugin(backend=backend)
    if not isinstance(plugin, TorchDynamoPlugin):
        raise TypeError(f"dynamo_plugin must be a TorchDynamoPlugin, got {type(plugin).__name__}")
    return plugin


def _warn_dynamo(plugin: TorchDynamoPlugin, settings: env.EnvSettings) -> None:
    """Say when a compile setting is overridden or has no effect (once, main process)."""
    resolve_setting("dynamo_backend", given=plugin.to_dict()["backend"],
                    from_env=settings.dynamo_backend, default=None)
    unused = [name for name in plugin.to_kwargs() if name != "disable"]
    if plugin.use_regional_compilation:
        unused.append("use_regional_compilation")
    if not plugin.compiles and unused:
        warn_user(f"torch.compile settings {', '.join(unused)} are ignored: the dynamo backend "
                  "is 'no', so nothing is compiled; set dynamo_backend='inductor' (or "
                  "ACCEL_DYNAMO_BACKEND / accel launch --dynamo_backend) to compile")


def _disagree(name: str, *, ctor: Any, env_name: str, env_value: Any) -> None:
    warn_user(f"Accelerator({name}={ctor!r}) overrides {env_name}={env_value!r} set by "
              f"`accel launch`; using {ctor!r}")


def resolve_setting(name: str, *, given: _V | None, from_env: _V | None, default: _V,
                    shown: Callable[[Any], Any] = lambda value: value) -> _V:
    """One scalar setting: the constructor's ``given`` > ``accel launch``'s ``from_env``
    (variable ``ACCEL_<NAME>``) > ``default``. When both are set and differ, the constructor's
    wins with one warning that names the variable (values as ``shown`` gives them).

    Example:
        >>> resolve_setting("timeout", given=None, from_env=30.0, default=None)
        30.0
        >>> resolve_setting("timeout", given=None, from_env=None, default=600.0)
        600.0
    """
    if given is None:
        return from_env if from_env is not None else default
    if from_env is not None and from_env != given:
        _disagree(name, ctor=shown(given), env_name=f"ACCEL_{name.upper()}",
                  env_value=shown(from_env))
    return given


def resolve_sync_batchnorm(ctor: bool | str | None, settings: env.EnvSettings) -> str | None:
    """The SyncBatchNorm mode: ``ctor`` > ``ACCEL_SYNC_BATCHNORM`` > off (None).

    Example:
        >>> resolve_sync_batchnorm(None, env.EnvSettings(sync_batchnorm="node"))
        'node'
        >>> resolve_sync_batchnorm(True, env.EnvSettings()), resolve_sync_batchnorm(False,
        ...     env.EnvSettings())
        ('global', None)
    """
    given = None if ctor is None else parse_mode(ctor, "Accelerator(sync_batchnorm=...)") or "off"
    mode = resolve_setting("sync_batchnorm", given=given, from_env=settings.sync_batchnorm,
                           default="off")  # "global" | "node" | "off"
    return None if mode == "off" else mode


def resolve_precision(ctor: str | PrecisionType | None, settings: env.EnvSettings
                      ) -> PrecisionType:
    """The mixed-precision mode: ``ctor`` > ``ACCEL_MIXED_PRECISION`` > ``"no"``."""
    from_env = parse_mixed_precision(settings.mixed_precision) if settings.mixed_precision \
        else None
    return resolve_setting("mixed_precision", from_env=from_env, default=PrecisionType.NO,
                           given=None if ctor is None else parse_mixed_precision(ctor),
                           shown=lambda mode: mode.value)


def _resolve_accumulation(steps: int | None, plugin: GradientAccumulationPlugin | None,
                          settings: env.EnvSettings) -> GradientAccumulationPlugin:
    """The accumulation plugin to use; the user's plugin object is never modified."""
    if steps is not None and plugin is not None:
        raise ValueError("pass either gradient_accumulation_steps or "
                         "gradient_accumulation_plugin, not both")
    if steps is not None:
        steps = parse_int(steps, name="gradient_accumulation_steps", minimum=1, strict=True)
        plugin = GradientAccumulationPlugin(num_steps=steps)
    num_steps = resolve_setting("gradient_accumulation_steps", default=1,
                                given=plugin.num_steps if plugin is not None else None,
                                from_env=settings.gradient_accumulation_steps)
    if plugin is None:
        return GradientAccumulationPlugin(num_steps=num_steps)
    return plugin if plugin.num_steps is not None else dataclasses.replace(plugin,
                                                                            num_steps=num_steps)


def _resolve_project(project_dir: str | os.PathLike[str] | None,
                     config: ProjectConfiguration | None) -> ProjectConfiguration:
    """The project configuration to use; the user's object is never modified."""
    directory = None if project_dir is None else os.fspath(project_dir)
    if config is None:
        return ProjectConfiguration(project_dir=directory)
    if directory is None:
        return config
    if config.project_dir not in (None, directory):
        raise ValueError(f"project_dir={directory!r} disagrees with project_config."
                         f"project_dir={config.project_dir!r}; pass one of them")
    return dataclasses.replace(config, project_dir=directory,
                               logging_dir=config.logging_dir or directory)


def _resolve_timeout(ctor: float | timedelta | None, handler: InitProcessGroupKwargs | None,
                     settings: env.EnvSettings) -> timedelta | None:
    from_ctor = to_timedelta(ctor, "timeout")
    from_handler = to_timedelta(handler.timeout, "InitProcessGroupKwargs.timeout") \
        if handler is not None else None
    if from_ctor is not None and from_handler is not None and from_ctor != from_handler:
        raise ValueError(f"timeout={ctor!r} and InitProcessGroupKwargs(timeout="
                         f"{from_handler.total_seconds()!r}) disagree; pass one of them")
    return resolve_setting("timeout", given=from_ctor or from_handler, default=None,
                           from_env=to_timedelta(settings.timeout, "ACCEL_TIMEOUT"),
                           shown=lambda value: value.total_seconds())
