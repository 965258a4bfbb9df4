"""The ``Accelerator`` facade: composition and delegation only.

Example:
    >>> import torch
    >>> from accel import Accelerator
    >>> accelerator = Accelerator(cpu=True)
    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> model, optimizer = accelerator.prepare(model, optimizer)
    >>> loss = model(torch.ones(4, 2)).pow(2).mean()
    >>> accelerator.backward(loss)
    >>> optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, overload

import torch
from torch import nn

from .._base.parse import parse_int
from ..config.fsdp import FullyShardedDataParallelPlugin
from ..config.parallelism import ParallelismConfig
from ..config.settings import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    KwargsHandler,
    PrecisionType,
    ProjectConfiguration,
)
from ..data import PreparedDataLoader, gather_for_metrics, send_to_device, skip_first_batches
from ..distributed.sync import any_rank
from ..run.accumulation import AccumulationState
from ..run.connector import Arguments, connect
from ..run.memory import release_memory
from ..run.prepare import Preparer
from ..run.progress import tqdm as _tqdm
from ..run.state import RunState
from ..run.step import StepController
from ..run.wrappers import AcceleratedOptimizer, AcceleratedScheduler
from ..strategy.compile import DynamoBackend, TorchDynamoPlugin
from ..tracking.trackers import TrackerSet
from ..tracking.trackers import init_trackers as _init_trackers
from .checkpoints import CheckpointingMixin
from .process import ProcessMixin

__all__ = ["Accelerator"]


class Accelerator(CheckpointingMixin, ProcessMixin):
    """Run one training loop on CPU, CUDA or XLA, in one process or many.

    Arguments and properties follow Hugging Face Accelerate's names; ``dynamo_backend`` (e.g.
    ``"inductor"``) or ``dynamo_plugin=TorchDynamoPlugin(...)`` makes ``prepare()`` compile
    models with ``torch.compile``. ``sync_batchnorm="global"`` (or True) makes ``prepare()``
    turn BatchNorm layers into SyncBatchNorm over all processes, ``"node"`` over the processes
    of each machine (also on CPU); None: ``ACCEL_SYNC_BATCHNORM``, else left alone. Settings
    resolve as: constructor argument > ``ACCEL_*`` variables (from ``accel launch``) > default;
    see :mod:`accel.run.connector`. The object itself only delegates: to the runtime built by
    ``connect`` (communicator, precision, strategy), to the run state (what was prepared), and
    to the collaborators below.

    This is the engine's facade; ``accel.Accelerator`` is its subclass in
    :mod:`accel.compat.accelerator`, which adds what only Accelerate has (``state``,
    ``gradient_state``, ``distributed_type``, the refused arguments and attributes).
    """

    def __init__(
        self,
        device_placement: bool = True,
        mixed_precision: str | PrecisionType | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool = False,
        device: str | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        timeout: float | timedelta | None = None,
        sync_batchnorm: bool | str | None = None,
        dynamo_backend: DynamoBackend | str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
    ) -> None:
        given = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        opts, rt = connect(Arguments(**given))  # the arguments, by name
        self._options, self._rt = opts, rt
        self._run = RunState(accumulation=AccumulationState.from_plugin(opts.accumulation))
        self._prep = Preparer.for_run(rt, opts, self._run)
        self._step = StepController(rt.precision, rt.strategy, self._run, rt.comm, rt.monitor.mark)
        self._trackers = TrackerSet.pending(rt.context.is_main_process) \
            if opts.log_with is not None else TrackerSet()
        self._announce()

    # -- description ---------------------------------------------------------------------------
    def _announce(self) -> None:
        ctx = self._rt.context
        if ctx.is_distributed and ctx.is_main_process:
            print(f"accel: {self._rt.hardware.describe(ctx.world_size)}; collective "
                  f"timeout {self.timeout.total_seconds():.0f} s", file=sys.stderr, flush=True)

    def __repr__(self) -> str:
        return (f"Accelerator({self._rt.hardware.describe(self.num_processes)}, "
                f"rank {self.process_index}, mixed_precision={self.mixed_precision!r})")

    # -- properties ----------------------------------------------------------------------------
    @property
    def gradient_accumulation_plugin(self) -> GradientAccumulationPlugin:
        return self._options.accumulation

    @property
    def dataloader_config(self) -> DataLoaderConfiguration:
        return self._options.dataloader_config

    @dataloader_config.setter
    def dataloader_config(self, config: DataLoaderConfiguration) -> None:
        """Data loaders prepared from now on use ``config``; loaders prepared already keep theirs
        (as in Accelerate)."""
        if not isinstance(config, DataLoaderConfiguration):
            raise TypeError("dataloader_config must be a DataLoaderConfiguration, got "
                            f"{type(config).__name__}")
        self._options = dataclasses.replace(self._options, dataloader_config=config)
        self._prep = dataclasses.replace(self._prep, dataloader_config=config)

    @property
    def project_configuration(self) -> ProjectConfiguration:
        return self._options.project

    @property
    def rng_types(self) -> list[str]:
        return list(self._options.rng_types)

    @property
    def step_scheduler_with_optimizer(self) -> bool:
        return self._options.step_scheduler_with_optimizer

    @property
    def device_placement(self) -> bool:
        return self._options.device_placement

    @property
    def sync_batchnorm(self) -> bool | str:
        """``"global"`` or ``"node"``: prepare() turns BatchNorm layers into SyncBatchNorm over
        all processes or over each machine's; False: they are left alone."""
        return self._options.sync_batchnorm or False

    @property
    def timeout(self) -> timedelta:
        """The collective timeout of the process group."""
        return self._rt.timeout

    @property
    def device(self) -> torch.device:
        return self._rt.context.device

    @property
    def process_index(self) -> int:
        return self._rt.context.rank

    @property
    def local_process_index(self) -> int:
        return self._rt.context.local_rank

    @property
    def num_processes(self) -> int:
        return self._rt.context.world_size

    @property
    def is_main_process(self) -> bool:
        return self._rt.context.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self._rt.context.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self._rt.context.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self._rt.context.is_distributed

    @property
    def mixed_precision(self) -> str:
        return self._rt.precision.mode.value

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self._rt.precision.scaler

    @property
    def sync_gradients(self) -> bool:
        """Whether the current micro-step synchronises gradients (and steps the optimizer)."""
        return self._run.accumulation.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._run.accumulation.sync_gradients = bool(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._run.accumulation.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self._run.accumulation.num_steps = parse_int(value, name="gradient_accumulation_steps",
                                                     minimum=1, strict=True)

    @property
    def step(self) -> int:
        """Micro-steps taken in the current accumulation group."""
        return self._run.accumulation.step

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return self._run.optimizer_step_was_skipped

    @property
    def end_of_dataloader(self) -> bool:
        return self._run.data.end_of_dataloader

    # -- prepare -------------------------------------------------------------------------------
    # Overloads that keep the count: ``model, opt, dl = acc.prepare(model, opt)`` is a type
    # error before it is a ValueError at run time. Each element stays ``Any``: a prepared
    # model may be a DDP/FSDP wrapper of the one passed in (``unwrap_model`` gives it back)
    # and a prepared loader is not a ``DataLoader`` subclass, so a narrower type would reject
    # the usual ``model = acc.prepare(model)``, and the passed-in type would not be true.
    @overload
    def prepare(self, *, device_placement: list[bool] | None = None) -> tuple[()]: ...
    @overload
    def prepare(self, a: Any, /, *, device_placement: list[bool] | None = None) -> Any: ...
    @overload
    def prepare(self, a: Any, b: Any, /, *,
                device_placement: list[bool] | None = None) -> tuple[Any, Any]: ...
    @overload
    def prepare(self, a: Any, b: Any, c: Any, /, *,
                device_placement: list[bool] | None = None) -> tuple[Any, Any, Any]: ...
    @overload
    def prepare(self, a: Any, b: Any, c: Any, d: Any, /, *,
                device_placement: list[bool] | None = None) -> tuple[Any, Any, Any, Any]: ...
    @overload
    def prepare(self, a: Any, b: Any, c: Any, d: Any, e: Any, /, *,
                device_placement: list[bool] | None = None
                ) -> tuple[Any, Any, Any, Any, Any]: ...
    @overload
    def prepare(self, a: Any, b: Any, c: Any, d: Any, e: Any, f: Any, /, *,
                device_placement: list[bool] | None = None
                ) -> tuple[Any, Any, Any, Any, Any, Any]: ...
    @overload
    def prepare(self, *args: Any, device_placement: list[bool] | None = None
                ) -> tuple[Any, ...]: ...

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers; returned in the same order.

        Raises:
            TypeError: an object of an unsupported kind, naming it.
            ValueError: the same object passed twice.
        """
        places = device_placement or [self.device_placement] * len(args)
        out = self._prep.prepare(args, places)
        return out[0] if len(out) == 1 else tuple(out)

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> nn.Module:
        """Move ``model`` to the device, wrap it (DDP) unless ``evaluation_mode``, add autocast,
        and compile it when a dynamo backend is set (``torch.compile`` of the wrapped model).
        A model this Accelerator prepared already comes back unchanged (never wrapped twice)."""
        if any(model is prepared for prepared in self._run.models):
            return model
        place = self.device_placement if device_placement is None else device_placement
        wrapped = self._prep.prepare_model(model, place=place, evaluation_mode=evaluation_mode)
        self._run.prepared_ids.add(id(wrapped))
        return wrapped

    def prepare_data_loader(self, data_loader: torch.utils.data.DataLoader[Any],
                            device_placement: bool | None = None) -> PreparedDataLoader:
        """Shard ``data_loader`` by rank and move its batches to the device."""
        place = self.device_placement if device_placement is None else device_placement
        return self._prep.prepare_data_loader(data_loader, place=place)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        return self.prepare(optimizer)  # type: ignore[no-any-return]

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        return self.prepare(scheduler)  # type: ignore[no-any-return]

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader whose next pass starts after ``num_batches`` batches (resuming by hand
        after ``load_state``; not needed with ``use_stateful_dataloader=True``)."""
        return skip_first_batches(dataloader, num_batches)

    # -- training step -------------------------------------------------------------------------
    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Accumulate gradients over ``gradient_accumulation_steps`` micro-batches."""
        return self._step.accumulate(models)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient synchronisation for backward passes inside the block."""
        return self._rt.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Make the backward run in this block all-reduce the gradients, also when the loss's
        forward ran under ``no_sync`` (the gradients accumulated locally are synced with it).

        With ``find_unused_parameters=True`` DDP needs the loss's outputs to find the unused
        parameters: run that forward inside this block too. Does nothing without DDP.

        Example:
            >>> import torch
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> model = accelerator.prepare(torch.nn.Linear(2, 1))
            >>> with accelerator.no_sync(model):
            ...     loss_a = model(torch.ones(1, 2)).sum()
            ...     loss_b = model(torch.ones(1, 2)).sum()
            >>> accelerator.backward(loss_a)  # local only
            >>> with accelerator.trigger_sync_in_backward(model):
            ...     accelerator.backward(loss_b)  # syncs the sum of both
        """
        return self._rt.strategy.trigger_sync(model)

    def backward(self, loss: torch.Tensor, num_items: float | int | torch.Tensor | None = None,
                 **kwargs: Any) -> None:
        """Backward with loss scaling and accumulation.

        Args:
            loss: the micro-batch's mean loss; or, with ``num_items``, its SUM over items.
            num_items: number of items (e.g. tokens) summed in ``loss``. Gradients are then
                normalised by the item count of the whole accumulation group on all ranks.
        """
        self._step.backward(loss, num_items, **kwargs)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Unscale fp16 gradients (once per real optimizer step)."""
        self._step.unscale_gradients(optimizer)

    def clip_grad_norm_(self, parameters: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor | None:
        """Unscale then clip; a no-op returning None on accumulation micro-steps."""
        return self._step.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Unscale then clip values; a no-op on accumulation micro-steps."""
        self._step.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: AutocastKwargs | None = None
                 ) -> contextlib.AbstractContextManager[Any]:
        """The mixed-precision forward context (a no-op with mixed_precision='no')."""
        return self._rt.precision.forward_context(autocast_handler)

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> nn.Module:
        """The user's module without the DDP wrapper (and autocast, if asked).

        Args:
            model: a model returned by ``prepare()``.
            keep_fp32_wrapper: False removes the mixed-precision forward wrapper.
            keep_torch_compile: a compiled model comes back compiled (Accelerate's default):
                ``torch.compile(module)`` rather than ``torch.compile(DDP(module))`` (a new
                wrapper with the same settings; the one being trained is left as it is). False
                returns the plain module.

        Example:
            >>> import torch
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True, dynamo_backend="eager")
            >>> net = torch.nn.Linear(2, 1)
            >>> model = accelerator.prepare(net)
            >>> type(model).__name__
            'OptimizedModule'
            >>> accelerator.unwrap_model(model, keep_torch_compile=False) is net
            True
        """
        strategy = self._rt.strategy
        inner = strategy.unwrap(model)
        result = strategy.unwrap(model, keep_torch_compile=True) if keep_torch_compile else inner
        if not keep_fp32_wrapper:
            for module in {id(model): model, id(inner): inner, id(result): result}.values():
                self._rt.precision.unwrap_forward(module)
        return result

    # -- collectives ---------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors from all ranks along dim 0 (first dims may differ)."""
        return self._rt.comm.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather per-sample outputs so that every sample appears exactly once, in order."""
        return gather_for_metrics(self._rt.comm, tracker=self._run.data, data=input_data,
                                  use_gather_object=use_gather_object)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce (sum, mean, max, min) across ranks; returns new tensors."""
        return self._rt.comm.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0,
                             pad_first: bool = False) -> Any:
        return self._rt.comm.pad_across_processes(tensor, dim=dim, pad_index=pad_index,
                                                  pad_first=pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        return self._rt.comm.broadcast(tensor, from_process)

    def wait_for_everyone(self) -> None:
        """Barrier across all ranks."""
        self._rt.comm.barrier()

    def on_signal(self, handler: Callable[[int], None],
                  signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """On SIGTERM/SIGINT run ``handler(signum)`` once on every rank at one point, then exit.

        The point is the next ``check_signal()`` or collective through accel that no rank has
        passed yet, so ``handler`` may call ``save_state()``. Call on every rank, e.g.
        ``accelerator.on_signal(lambda signum: accelerator.save_state())``.
        """
        self._rt.monitor.on_signal(handler, signals)

    def check_signal(self) -> None:
        """A cheap sync point (no communication) for ``on_signal``; call it once per step."""
        self._rt.monitor.point()

    def set_trigger(self) -> None:
        """Flag a condition on this rank (e.g. early stopping) for ``check_trigger``."""
        self._run.trigger = True

    def check_trigger(self) -> bool:
        """True on every rank if any rank called ``set_trigger`` (then resets it)."""
        fired = any_rank(self._rt.comm, flag=self._run.trigger)
        if fired:
            self._run.trigger = False
        return fired

    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None
                           ) -> contextlib.AbstractContextManager[Any]:
        """Let DDP ranks with fewer batches join the others' collectives (torch ``Join``).

        ``even_batches`` overrides ``DataLoaderConfiguration(even_batches=...)`` inside the
        block for the prepared map-style loaders (iterable ones keep theirs, with a warning);
        Join is enabled when batches are not evened out. Other strategies warn and run the
        block unchanged, as in Accelerate.
        """
        return self._step.join_uneven_inputs(joinables, even_batches=even_batches,
                                             default_even=self.dataloader_config.even_batches)

    # -- process helpers (the rest: ProcessMixin) ----------------------------------------------
    def tqdm(self, iterable: Any = None, *args: Any, main_process_only: bool = True,
             **kwargs: Any) -> Any:
        """A progress bar shown on the main process only."""
        return _tqdm(iterable, *args, main_process_only=main_process_only,
                     is_main=self.is_main_process, **kwargs)

    # -- trackers ------------------------------------------------------------------------------
    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, Any] | None = None) -> None:
        """Start the trackers named by ``log_with`` (only the main process writes)."""
        if self._options.log_with is None:
            raise ValueError("init_trackers() needs Accelerator(log_with=...), e.g. "
                             "log_with='jsonl' with project_dir='runs'")
        self._trackers = _init_trackers(self._options.log_with, project_name, config,
                                        self._options.project.logging_dir,
                                        self.is_main_process, init_kwargs)

    @property
    def trackers(self) -> list[Any]:
        return list(self._trackers.trackers)

    def log(self, values: dict[str, Any], step: int | None = None,
            log_kwargs: dict[str, Any] | None = None) -> None:
        """Log ``values`` to every tracker (main process only).

        On a process that did not call ``init_trackers`` (e.g. it was called under
        ``if accelerator.is_main_process:``) this does nothing, as in Accelerate.
        """
        self._trackers.log(values, step, log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        return self._trackers.get_tracker(name, unwrap)

    # -- memory --------------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop accel's references to prepared objects and release cached device memory."""
        self._run.clear()
        return release_memory(*objects)

    clear = free_memory

    def end_training(self) -> None:
        """Wait for a ``save_state(blocking=False)`` in flight, finish trackers and end the
        process group accel started."""
        self._run.saves.wait()
        self._trackers.end_training()
        self.wait_for_everyone()
        self._rt.monitor.close()
        self._rt.group.close()


Accelerator.send_to_device = staticmethod(send_to_device)  # type: ignore[attr-defined]
