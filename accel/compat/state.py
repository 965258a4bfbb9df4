"""Accelerate's ``PartialState``, ``AcceleratorState`` and ``GradientState``, as views.

Accelerate makes these singletons that share one ``__dict__`` per class. Here each object is a
view onto things that already have one owner: the process (its rank, its device, and the
default process group, which torch keeps once per process), an ``Accelerator``'s runtime, or
an ``Accelerator``'s run state. Nothing is kept at module level:

- ``PartialState()`` reads the process as it is set up. When a process group already exists
  (started by an ``Accelerator``, another ``PartialState``, or the user) it is adopted; otherwise
  it is started exactly as ``Accelerator()`` would start it (:func:`accel.run.connector.
  connect_process`, the connector's own path), so an ``Accelerator`` created later adopts it.
  Two ``PartialState()`` objects therefore always agree.
- ``accelerator.state`` is an ``AcceleratorState`` bound to that Accelerator's runtime (its
  communicator, precision and strategy); ``accelerator.gradient_state`` is a ``GradientState``
  bound to its run state, so ``accelerator.gradient_state.sync_gradients = False`` is the
  Accelerator's own flag. A standalone ``AcceleratorState()``/``GradientState()`` cannot find an
  ``Accelerator`` (there is no registry to look it up in): read ``accelerator.state`` and
  ``accelerator.gradient_state`` instead when you need that Accelerator's settings.

Example:
    >>> state = PartialState(cpu=True)
    >>> state.process_index, state.num_processes, state.distributed_type.value
    (0, 1, 'NO')
    >>> with state.split_between_processes(["a", "b", "c"]) as mine:
    ...     mine
    ['a', 'b', 'c']
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..accelerator.process import only_where, process_filter
from ..config.fsdp import FullyShardedDataParallelPlugin
from ..config.parallelism import ParallelismConfig
from ..config.settings import GradientAccumulationPlugin, InitProcessGroupKwargs
from ..data import PreparedDataLoader
from ..distributed import Communicator, ProcessContext, ProcessGroupHandle
from ..distributed.debug import consistency_check
from ..distributed.group import destroy_process_group
from ..distributed.sync import leader_first, split_for_rank
from ..run.accumulation import AccumulationState
from ..run.connector import Runtime, connect_process, resolve_precision, resolve_sharding
from ..run.state import RunState
from ..strategy import FSDPStrategy, select_strategy
from ..strategy.compile import TorchDynamoPlugin
from .distributed_type import DistributedType, distributed_type_of
from .operations import COMMUNICATORS
from .refusals import UNSUPPORTED_ARGUMENTS

__all__ = ["AcceleratorState", "GradientState", "PartialState", "bind_accelerator_state",
           "bind_gradient_state"]

_PLUGINS = ("deepspeed_plugin", "torch_tp_plugin", "megatron_lm_plugin")


@dataclass(kw_only=True, slots=True)
class _Process:
    """What a process view reads: the context, the group, and the collectives over it.

    ``distributed_type`` and ``debug`` can be set through the view, as in Accelerate (whose own
    test scripts set them to reach a code path); the rest is fixed when the process is set up.
    Two views are equal when they describe the same process (the group handle and the
    communicator are live objects, compared by what they serve, not by identity).
    """

    context: ProcessContext
    group: ProcessGroupHandle = field(compare=False)
    comm: Communicator = field(compare=False)
    distributed_type: DistributedType


def _connect(cpu: bool, *, kwargs: dict[str, Any]) -> tuple[_Process, Any]:
    try:
        init = InitProcessGroupKwargs(**kwargs) if kwargs else None
    except TypeError:
        raise TypeError(f"PartialState() got {sorted(kwargs)}; it accepts cpu= and the fields of "
                        "InitProcessGroupKwargs (backend, init_method, timeout), e.g. "
                        "PartialState(**InitProcessGroupKwargs(timeout=600).to_kwargs())") from None
    setup = connect_process(cpu=cpu, init=init)
    ctx, debug = setup.context, setup.settings.debug
    # Views of a job share its group's communicator (and so its debug setting) with accel.utils
    comm = COMMUNICATORS.current(ctx) if ctx.is_distributed else \
        Communicator(ctx, [consistency_check] if debug else [])
    process = _Process(context=ctx, group=setup.group, comm=comm,
                       distributed_type=distributed_type_of(select_strategy(ctx)))
    return process, setup.settings


class PartialState:
    """This process's place in the job, and process control, without an ``Accelerator``.

    Args:
        cpu: use the CPU even when an accelerator is visible.
        **kwargs: fields of ``InitProcessGroupKwargs`` (``backend``, ``init_method``,
            ``timeout``), used only when this call starts the process group.

    Example:
        >>> state = PartialState(cpu=True)
        >>> state.is_main_process, state.use_distributed, str(state.device)
        (True, False, 'cpu')
        >>> PartialState(cpu=True).process_index == state.process_index  # two views agree
        True
    """

    _process: _Process

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Accelerate's tests call this to forget the shared state between two Accelerators.
        accel keeps none (each object is a view), so there is nothing to reset."""

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        self._process = _connect(cpu, kwargs=kwargs)[0]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(distributed_type={self.distributed_type.value}, "
                f"backend={self.backend}, process_index={self.process_index}, "
                f"num_processes={self.num_processes}, "
                f"local_process_index={self.local_process_index}, device={self.device})")

    # -- who this process is --------------------------------------------------------------------
    initialized = True  # a state object exists only once the process is set up

    @property
    def process_index(self) -> int:
        return self._process.context.rank

    @property
    def local_process_index(self) -> int:
        return self._process.context.local_rank

    @property
    def num_processes(self) -> int:
        return self._process.context.world_size

    @property
    def device(self) -> torch.device:
        return self._process.context.device

    @property
    def distributed_type(self) -> DistributedType:
        """What this process runs as (``MULTI_CPU``, ``MULTI_GPU``, ``XLA``, ``NO``, ...).

        Setting it changes what this state, and the ``Accelerator`` it belongs to, report;
        models are still wrapped by the strategy the process was set up with.
        """
        return self._process.distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        self._process.distributed_type = DistributedType(value)

    @property
    def backend(self) -> str | None:
        """The process group's backend (``"gloo"``, ``"nccl"``, ...); None in one process."""
        ctx = self._process.context
        return ctx.backend if ctx.is_distributed else None

    @property
    def debug(self) -> bool:
        """``ACCEL_DEBUG=1``: collectives first check op/shape/dtype across ranks.

        Setting it turns the check on or off for this process: for the collectives of this
        state (and of its ``Accelerator``), of the other states of the job, and of the
        module-level ones in ``accel.utils`` (they share the process group's communicator).
        The environment is left as it is.
        """
        return consistency_check in self._process.comm.hooks

    @debug.setter
    def debug(self, value: bool) -> None:
        for comm in {id(c): c for c in (self._process.comm, COMMUNICATORS.current())}.values():
            hooks = comm.hooks
            if value and consistency_check not in hooks:
                hooks.append(consistency_check)
            elif not value and consistency_check in hooks:
                hooks.remove(consistency_check)

    @property
    def use_distributed(self) -> bool:
        return self.distributed_type is not DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self._process.context.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._process.context.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self._process.context.is_last_process

    # -- process control ------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Barrier across all processes (returns at once in one process)."""
        self._process.comm.barrier()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first; the others wait without a timeout."""
        with leader_first(self._process.context, store=self._process.group.store()):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local main process first."""
        with leader_first(self._process.context, store=self._process.group.store(), local=True):
            yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of a list, tuple, tensor or dict of those.

        Shares differ by at most one item (earlier processes get the extra ones); with
        ``apply_padding`` every share is padded with the last item to the same length. In one
        process ``inputs`` is yielded unchanged, whatever its type.

        Example:
            >>> with PartialState(cpu=True).split_between_processes({"x": [1, 2]}) as mine:
            ...     mine
            {'x': [1, 2]}
        """
        if not self._process.context.is_distributed:
            yield inputs
            return
        yield split_for_rank(self._process.context, inputs=inputs, apply_padding=apply_padding)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on each node's local main process only (as Accelerate's ``state.print``)."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """End ``group`` (default: the default process group, whoever started it).

        Call it once at the end of a script, on every rank; afterwards no collective works.
        """
        destroy_process_group(group)

    # -- decorators -----------------------------------------------------------------------------
    def _only(self, runs: bool, *, function: Callable[..., Any]) -> Callable[..., Any]:
        return only_where(runs, distributed=self.use_distributed, function=function)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function`` to run on the main process only (a no-op elsewhere).

        Example:
            >>> state = PartialState(cpu=True)
            >>> state.on_main_process(lambda: "ran")()
            'ran'
        """
        return self._only(self.is_main_process, function=function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function`` to run on each node's local main process only."""
        return self._only(self.is_local_main_process, function=function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function`` to run on the last process only."""
        return self._only(self.is_last_process, function=function)

    def on_process(self, function: Callable[..., Any] | None = None,
                   process_index: int | None = None) -> Any:
        """Decorate ``function`` to run on process ``process_index`` only.

        Use it as ``@state.on_process(process_index=1)``. In one process it always runs.
        """
        return process_filter(lambda f, process_index: self._only(
            self.process_index == process_index, function=f), function=function,
            index=process_index, what="process_index")

    def on_local_process(self, function: Callable[..., Any] | None = None,
                         local_process_index: int | None = None) -> Any:
        """Decorate ``function`` to run on local process ``local_process_index`` of each node."""
        return process_filter(lambda f, local_process_index: self._only(
            self.local_process_index == local_process_index, function=f), function=function,
            index=local_process_index,
            what="local_process_index")


class AcceleratorState(PartialState):
    """``PartialState`` plus what an ``Accelerator`` chose (mixed precision, plugins).

    ``accelerator.state`` is the one to read: it reports that Accelerator's choices. A
    standalone ``AcceleratorState(mixed_precision=...)`` describes the same process and resolves
    ``mixed_precision`` as ``Accelerator`` does (argument > ``ACCEL_MIXED_PRECISION`` > "no").
    ``dynamo_plugin`` is the ``TorchDynamoPlugin`` the Accelerator compiles models with (a
    standalone state keeps the one it is given, else None); so are ``fsdp_plugin`` and
    ``parallelism_config`` (FSDP2). accel has no DeepSpeed, Megatron-LM or tensor-parallel
    plugins: those attributes are None and passing one raises.

    Example:
        >>> state = AcceleratorState(mixed_precision="bf16", cpu=True)
        >>> state.mixed_precision, state.deepspeed_plugin, state.num_processes
        ('bf16', None, 1)
    """

    _mixed_precision: str
    dynamo_plugin: TorchDynamoPlugin | None = None

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False,
                 dynamo_plugin: TorchDynamoPlugin | None = None, **kwargs: Any) -> None:
        if dynamo_plugin is not None and not isinstance(dynamo_plugin, TorchDynamoPlugin):
            raise TypeError("AcceleratorState(dynamo_plugin=...) must be a TorchDynamoPlugin, got "
                            f"{type(dynamo_plugin).__name__}")
        self.dynamo_plugin = dynamo_plugin
        plugin, mesh = kwargs.pop("fsdp_plugin", None), kwargs.pop("parallelism_config", None)
        resolve_sharding(plugin, mesh)  # types first, before any process group starts
        for name in _PLUGINS:
            if kwargs.pop(name, None) is not None:
                hint = UNSUPPORTED_ARGUMENTS.get(name, "accel has no such plugin")
                raise TypeError(f"AcceleratorState({name}=...) is not supported: {hint}")
        self._process, settings = _connect(cpu, kwargs=kwargs)
        self._mixed_precision = resolve_precision(mixed_precision, settings).value
        sharding = resolve_sharding(plugin, mesh, settings)  # ACCEL_USE_FSDP from accel launch
        self.fsdp_plugin = sharding["fsdp_plugin"]
        self.parallelism_config = sharding["parallelism_config"]

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, mixed_precision={self.mixed_precision!r})"

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"`` or ``"bf16"``."""
        return self._mixed_precision

    # Accelerate's plugin attributes: FSDP (FSDP2) is accel's; DeepSpeed, Megatron-LM and tensor
    # parallelism are not, so those stay None.
    deepspeed_plugin: None = None
    deepspeed_plugins: None = None
    fsdp_plugin: FullyShardedDataParallelPlugin | None = None
    megatron_lm_plugin: None = None
    torch_tp_plugin: None = None
    parallelism_config: ParallelismConfig | None = None
    _mesh: Callable[[], Any] | None = None

    @property
    def is_fsdp2(self) -> bool:
        """True when models are sharded with FSDP (accel's FSDP is FSDP2)."""
        return self.fsdp_plugin is not None

    @property
    def device_mesh(self) -> Any:
        """The FSDP run's ``DeviceMesh`` (built at the first prepared model), else None."""
        return None if self._mesh is None else self._mesh()


def bind_accelerator_state(runtime: Runtime, dynamo_plugin: TorchDynamoPlugin | None = None,
                           distributed_type: DistributedType | None = None) -> AcceleratorState:
    """The ``AcceleratorState`` view of an ``Accelerator``'s runtime (``accelerator.state``).

    It shares the runtime's communicator (with its stall monitor), group and strategy, and
    reports the Accelerator's compile settings (``dynamo_plugin``) and ``distributed_type``
    (default: derived from the runtime's strategy).
    """
    state = AcceleratorState.__new__(AcceleratorState)
    state.dynamo_plugin = dynamo_plugin
    kind = distributed_type or distributed_type_of(runtime.strategy)
    state._process = _Process(context=runtime.context, group=runtime.group, comm=runtime.comm,
                              distributed_type=kind)
    state._mixed_precision = runtime.precision.mode.value
    strategy = runtime.strategy
    if isinstance(strategy, FSDPStrategy):
        state.fsdp_plugin, state.parallelism_config = strategy.plugin, strategy.mesh.parallelism
        state._mesh = functools.partial(strategy.mesh.get, strategy.ctx)
    return state


class GradientState:
    """Gradient-accumulation and data-loader state of one run (``accelerator.gradient_state``).

    A standalone ``GradientState(plugin)`` has a run of its own, seen by no ``Accelerator``; read
    and set ``accelerator.gradient_state`` to act on an Accelerator's run.

    Example:
        >>> state = GradientState(GradientAccumulationPlugin(num_steps=4))
        >>> state.num_steps, state.sync_gradients, state.in_dataloader, state.remainder
        (4, True, False, -1)
    """

    _run: RunState

    @classmethod
    def _reset_state(cls) -> None:
        """Accelerate's tests call this between runs; a ``GradientState`` is a view of one
        run's state, so there is nothing shared to reset."""

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None
                 ) -> None:
        plugin = gradient_accumulation_plugin or GradientAccumulationPlugin()
        self._run = RunState(accumulation=AccumulationState.from_plugin(plugin))

    def __repr__(self) -> str:
        return (f"GradientState(sync_gradients={self.sync_gradients}, "
                f"end_of_dataloader={self.end_of_dataloader}, remainder={self.remainder}, "
                f"plugin_kwargs={self.plugin_kwargs})")

    initialized = True

    @property
    def sync_gradients(self) -> bool:
        """Whether the current micro-step synchronises gradients (and steps the optimizer)."""
        return self._run.accumulation.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._run.accumulation.sync_gradients = bool(value)

    @property
    def num_steps(self) -> int:
        return self._run.accumulation.num_steps

    @property
    def adjust_scheduler(self) -> bool:
        return self._run.accumulation.adjust_scheduler

    @property
    def sync_with_dataloader(self) -> bool:
        return self._run.accumulation.sync_with_dataloader

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The accumulation settings in effect, by ``GradientAccumulationPlugin`` field name."""
        acc = self._run.accumulation
        return {"num_steps": acc.num_steps, "adjust_scheduler": acc.adjust_scheduler,
                "sync_with_dataloader": acc.sync_with_dataloader,
                "sync_each_batch": acc.sync_each_batch}

    @property
    def active_dataloader(self) -> PreparedDataLoader | None:
        """The innermost prepared loader being iterated, or None."""
        return self._run.data.active

    @property
    def in_dataloader(self) -> bool:
        return self._run.data.in_dataloader

    @property
    def end_of_dataloader(self) -> bool:
        """True while the batch just yielded by the active loader is its last."""
        return self._run.data.end_of_dataloader

    @property
    def remainder(self) -> int:
        """Padding duplicates in the batch the active loader just yielded; -1 outside a loader."""
        active = self._run.data.active
        return -1 if active is None else active.remainder


def bind_gradient_state(run: RunState) -> GradientState:
    """The ``GradientState`` view of an ``Accelerator``'s run state."""
    state = GradientState.__new__(GradientState)
    state._run = run
    return state
