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
import functools
import signal
import sys
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import _tree, env
from .logging import main_print
from .memory import release_memory
from .progress import tqdm as _tqdm
from .accumulation import AccumulationState
from .checkpoint import RunSnapshot, check_registrable, load_run, save_run
from .checkpoint.storage import files as _ckpt_files
from .config import (AutocastKwargs, DataLoaderConfiguration, DistributedType,
                     GradientAccumulationPlugin, KwargsHandler, PrecisionType,
                     ProjectConfiguration)
from .data import DataTracker, PreparedDataLoader, send_to_device, skip_first_batches
from .device import select_device
from .distributed import Communicator, build_context, start_process_group
from .distributed.debug import consistency_check
from .distributed.stall import CollectiveMonitor
from .distributed.sync import leader_first, split_for_rank
from .precision import make_precision
from .preparation import Preparer, remove_autocast
from .settings import (UNSUPPORTED_ARGUMENTS, check_argument_types, resolve_accumulation, resolve_precision,
                       resolve_timeout, sort_handlers)
from .strategy import select_strategy, unwrap_module
from .tracking import TrackerSet, init_trackers as _init_trackers
from .training import StepController
from .wrappers import AcceleratedOptimizer, AcceleratedScheduler

__all__ = ["Accelerator"]


class Accelerator:
    """Run one training loop on CPU, CUDA or XLA, in one process or many.

    Arguments and properties follow Hugging Face Accelerate's names. Settings resolve as:
    constructor argument > ``ACCEL_*`` variables (from ``accel launch``) > default.
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
        sync_batchnorm: bool = False,
        **unsupported: Any,
    ) -> None:
        for name in unsupported:
            hint = UNSUPPORTED_ARGUMENTS.get(name, "it is not an Accelerator argument")
            raise TypeError(f"Accelerator() got an unsupported argument {name!r}: {hint}")
        check_argument_types(cpu, device_placement, project_dir, log_with,
                             step_scheduler_with_optimizer)
        settings = env.read_settings()
        if settings.num_threads is not None and torch.get_num_threads() != settings.num_threads:
            torch.set_num_threads(settings.num_threads)
        handlers = sort_handlers(kwargs_handlers)
        self._settings = settings
        self._precision_mode = resolve_precision(mixed_precision, settings)
        plugin = resolve_accumulation(gradient_accumulation_steps, gradient_accumulation_plugin,
                                      settings)
        self.gradient_accumulation_plugin = plugin
        self.dataloader_config = dataloader_config or DataLoaderConfiguration()
        if not isinstance(self.dataloader_config, DataLoaderConfiguration):
            raise TypeError("dataloader_config must be a DataLoaderConfiguration")
        if project_config is not None and project_dir is not None and \
                project_config.project_dir not in (None, project_dir):
            raise ValueError(f"project_dir={project_dir!r} disagrees with project_config."
                             f"project_dir={project_config.project_dir!r}; pass one of them")
        self.project_configuration = project_config or ProjectConfiguration(project_dir=project_dir)
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.project_dir = project_dir
            self.project_configuration.logging_dir = self.project_configuration.logging_dir or project_dir
        self.rng_types = self._check_rng_types(rng_types)
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.device_placement = device_placement
        self.sync_batchnorm = bool(sync_batchnorm)
        self._autocast_kwargs = handlers.autocast or AutocastKwargs()

        info = env.detect_launch()
        device_kind = select_device(device, cpu, settings)
        self.state = build_context(info, device_kind)
        self._device_kind = device_kind
        init = handlers.init
        self.timeout = resolve_timeout(timeout, init, settings)
        self._group = start_process_group(self.state, info, device_kind, self.timeout,
                                          init.backend if init else None,
                                          init.init_method if init else None)
        self.timeout = self._group.timeout
        self._monitor = CollectiveMonitor(self.state.rank, self.state.world_size,
                                          self._group.store(), settings.stall_seconds,
                                          self.timeout, attempt=info.restart_count)
        self._comm = Communicator(self.state, [self._monitor] + ([consistency_check]
                                                                 if settings.debug else []))
        self._precision = make_precision(self._precision_mode, self.state.device,
                                         self._autocast_kwargs, handlers.scaler,
                                         device_kind.supports_bf16())
        self._strategy = select_strategy(self.state, device_placement, handlers.ddp)
        self._accumulation = AccumulationState(
            num_steps=plugin.num_steps or 1, adjust_scheduler=plugin.adjust_scheduler,
            sync_with_dataloader=plugin.sync_with_dataloader,
            sync_each_batch=plugin.sync_each_batch)
        self._tracker = DataTracker()
        self._prep = Preparer(self._comm, self._precision, self._strategy, self._accumulation,
                              self._tracker, self.dataloader_config,
                              step_scheduler_with_optimizer, self.sync_batchnorm)
        # the registries live on the preparer; these names share the same lists
        self._models, self._optimizers = self._prep.models, self._prep.optimizers
        self._schedulers, self._dataloaders = self._prep.schedulers, self._prep.dataloaders
        self._sections = 0
        self._trigger = False
        self._custom: list[Any] = []  # register_for_checkpointing() objects, by position
        self._loaded_dir: Path | None = None  # the checkpoint loaded last is never rotated away
        self._step = StepController(self._precision, self._strategy, self._accumulation,
                                    self._comm, self._tracker, self._models, self._optimizers)
        self._log_with = log_with
        self._trackers = TrackerSet()
        self._announce()

    # -- description ---------------------------------------------------------------------------
    def _announce(self) -> None:
        if self.state.is_distributed and self.state.is_main_process:
            seconds = self.timeout.total_seconds() if self.timeout else 0
            print(f"accel: {self._device_kind.describe(self.state.world_size)}; "
                  f"collective timeout {seconds:.0f} s", file=sys.stderr, flush=True)

    @staticmethod
    def _check_rng_types(rng_types: list[str] | None) -> list[str]:
        allowed = ("torch", "cuda", "xla", "generator")
        for item in rng_types or []:
            if item not in allowed:
                raise ValueError(f"unknown rng type {item!r}; expected some of {allowed}")
        return list(rng_types or [])

    def __repr__(self) -> str:
        return (f"Accelerator({self._device_kind.describe(self.state.world_size)}, "
                f"rank {self.process_index}, mixed_precision={self.mixed_precision!r})")

    # -- properties ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def process_index(self) -> int:
        return self.state.rank

    @property
    def local_process_index(self) -> int:
        return self.state.local_rank

    @property
    def num_processes(self) -> int:
        return self.state.world_size

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.is_distributed

    @property
    def distributed_type(self) -> DistributedType:
        if self.state.device.type == "xla":
            return DistributedType.MULTI_XLA if self.state.is_distributed else DistributedType.XLA
        if not self.state.is_distributed:
            return DistributedType.NO
        return DistributedType.MULTI_GPU if self.state.device.type == "cuda" else \
            DistributedType.MULTI_CPU

    @property
    def mixed_precision(self) -> str:
        return self._precision_mode.value

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self._precision.scaler

    @property
    def sync_gradients(self) -> bool:
        return self._accumulation.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._accumulation.sync_gradients = bool(value)

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._accumulation.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {value!r}")
        self._accumulation.num_steps = value

    @property
    def step(self) -> int:
        """Micro-steps taken in the current accumulation group."""
        return self._accumulation.step

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    @property
    def end_of_dataloader(self) -> bool:
        return self._tracker.end_of_dataloader

    # -- prepare -------------------------------------------------------------------------------
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
        """Move ``model`` to the device, wrap it (DDP) unless ``evaluation_mode``, add autocast."""
        place = self.device_placement if device_placement is None else device_placement
        wrapped = self._prep.prepare_model(model, place, evaluation_mode)
        self._prep.prepared_ids.add(id(wrapped))
        return wrapped

    def prepare_data_loader(self, data_loader: torch.utils.data.DataLoader,
                            device_placement: bool | None = None) -> PreparedDataLoader:
        """Shard ``data_loader`` by rank and move its batches to the device."""
        place = self.device_placement if device_placement is None else device_placement
        return self._prep.prepare_data_loader(data_loader, place)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> AcceleratedOptimizer:
        return self.prepare(optimizer)  # type: ignore[no-any-return]

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        return self.prepare(scheduler)  # type: ignore[no-any-return]

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts after ``num_batches`` (not needed after ``load_state``)."""
        return skip_first_batches(dataloader, num_batches)

    # -- training step -------------------------------------------------------------------------
    def accumulate(self, *models: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Accumulate gradients over ``gradient_accumulation_steps`` micro-batches."""
        return self._step.accumulate(models)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation for backward passes inside the block."""
        with self._strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: nn.Module) -> Iterator[None]:
        """Force DDP to synchronise in the next backward even inside ``no_sync``."""
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            yield
            return
        old = model.require_backward_grad_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        try:
            yield
        finally:
            model.require_backward_grad_sync = old

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
        return self._precision.forward_context(autocast_handler)

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True) -> nn.Module:
        """The user's module, without DDP/compile wrappers (and autocast, if asked)."""
        inner = unwrap_module(model)
        if not keep_fp32_wrapper:
            for module in {id(model): model, id(inner): inner}.values():
                remove_autocast(module)
        return inner

    # -- collectives ---------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors from all ranks along dim 0 (first dims may differ)."""
        return self._comm.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather per-sample outputs so that every sample appears exactly once, in order."""
        loader = self._tracker.active
        data = loader.trim_for_metrics(input_data) if loader is not None else input_data
        group = loader.metrics_group if loader is not None else None
        try:
            leaves, rebuild = _tree.flatten(data, strict=True)
        except TypeError:  # a leaf that is not a tensor
            leaves = []
        if use_gather_object or not leaves:
            return self._comm.gather_object(data, group=group)
        return self._comm.gather_flat(leaves, rebuild, group=group)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce (sum, mean, max, min) across ranks; returns new tensors."""
        return self._comm.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0,
                             pad_first: bool = False) -> Any:
        return self._comm.pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        return self._comm.broadcast(tensor, from_process)

    def wait_for_everyone(self) -> None:
        """Barrier across all ranks."""
        self._comm.barrier()

    def on_signal(self, handler: Callable[[int], None],
                  signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """On SIGTERM/SIGINT run ``handler(signum)`` once on every rank at the same point, then exit.

        The point is the next ``check_signal()`` or collective through accel that no rank has
        passed yet, so ``handler`` may call ``save_state()``. Call on every rank, e.g.
        ``accelerator.on_signal(lambda signum: accelerator.save_state())``.
        """
        self._monitor.on_signal(handler, signals)

    def check_signal(self) -> None:
        """A cheap sync point (no communication) for ``on_signal``; call it once per step."""
        self._monitor.point()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first (others wait without a timeout)."""
        self._sections += 1
        with leader_first(self.state, self._group.store(), f"s{self._sections}"):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local main process first."""
        self._sections += 1
        with leader_first(self.state, self._group.store(), f"s{self._sections}", local=True):
            yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this rank's contiguous share of ``inputs``."""
        yield split_for_rank(self.state, inputs, apply_padding)

    def set_trigger(self) -> None:
        """Flag a condition on this rank (e.g. early stopping) for ``check_trigger``."""
        self._trigger = True

    def check_trigger(self) -> bool:
        """True on every rank if any rank called ``set_trigger`` (then resets it)."""
        flag = torch.tensor([1.0 if self._trigger else 0.0], device=self.device)
        fired = bool(self._comm.reduce(flag, "max")[0] > 0)
        if fired:
            self._trigger = False
        return fired

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None
                           ) -> Iterator[None]:
        """Let DDP ranks with fewer batches join the others' collectives (torch Join)."""
        if even_batches is not None:
            raise ValueError("join_uneven_inputs(even_batches=...) is not supported: set "
                             "DataLoaderConfiguration(even_batches=False) before prepare()")
        ddp = [j for j in joinables if isinstance(j, nn.parallel.DistributedDataParallel)]
        if not self.state.is_distributed or not ddp:
            yield
            return
        from torch.distributed.algorithms.join import Join

        with Join(ddp):
            yield

    # -- process helpers -----------------------------------------------------------------------
    def _run_if(self, condition: bool, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if condition else None
        return wrapper

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._run_if(self.is_main_process, function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._run_if(self.is_local_main_process, function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._run_if(self.is_last_process, function)

    def on_process(self, function: Callable[..., Any] | None = None,
                   process_index: int | None = None) -> Any:
        if process_index is None:
            raise ValueError("on_process needs process_index=<rank>")
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._run_if(self.process_index == process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        main_print(self.is_main_process, *args, **kwargs)

    def tqdm(self, iterable: Any = None, *args: Any, main_process_only: bool = True,
             **kwargs: Any) -> Any:
        """A progress bar shown on the main process only."""
        return _tqdm(iterable, *args, main_process_only=main_process_only,
                     is_main=self.is_main_process, **kwargs)

    # -- trackers ------------------------------------------------------------------------------
    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, Any] | None = None) -> None:
        """Start the trackers named by ``log_with`` (only the main process writes)."""
        if self._log_with is None:
            raise ValueError("init_trackers() needs Accelerator(log_with=...), e.g. "
                             "log_with='jsonl' with project_dir='runs'")
        self._trackers = _init_trackers(self._log_with, project_name, config,
                                        self.project_configuration.logging_dir,
                                        self.is_main_process, init_kwargs)

    @property
    def trackers(self) -> list[Any]:
        return list(self._trackers.trackers)

    def log(self, values: dict[str, Any], step: int | None = None,
            log_kwargs: dict[str, Any] | None = None) -> None:
        """Log ``values`` to every tracker (main process only)."""
        if self._log_with is not None and not self._trackers.names:
            raise RuntimeError("log() before init_trackers(); call "
                               "accelerator.init_trackers(project_name) first")
        self._trackers.log(values, step, log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        return self._trackers.get_tracker(name, unwrap)

    # -- checkpoints ---------------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include objects with ``state_dict``/``load_state_dict`` in ``save_state``.

        Their state may hold tensors, numpy arrays, numbers, strings and containers of them (it
        is stored as safetensors + JSON, never pickled). They are matched by position: register
        the same objects in the same order before ``load_state``.

        Example:
            >>> class Step:
            ...     def __init__(self): self.n = 0
            ...     def state_dict(self): return {"n": self.n}
            ...     def load_state_dict(self, state): self.n = state["n"]
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.register_for_checkpointing(Step())
        """
        for obj in objects:
            self._custom.append(check_registrable(obj))

    def _snapshot(self) -> RunSnapshot:
        p, acc = self._prep, self._accumulation
        return RunSnapshot(tuple(p.models), tuple(p.optimizers), tuple(p.schedulers),
                           tuple(p.dataloaders), tuple(self._custom), self._precision,
                           _UnwrappedModelIO(), self._device_kind, acc.step, acc.num_steps,
                           acc.sync_gradients,
                           max((o.steps_taken for o in p.optimizers), default=0), self._loaded_dir)

    def save_state(self, output_dir: str | None = None, total_limit: int | None = None,
                   **unsupported: Any) -> str:
        """Save everything prepared or registered, on every rank, atomically and without pickle.

        Models, optimizers, schedulers, the fp16 scaler, registered objects, each rank's RNG
        states and each prepared loader's position. Call it on every rank. Without
        ``output_dir`` it writes ``<project_dir>/checkpoints/checkpoint_<n+1>`` and keeps at most
        ``total_limit`` (or ``ProjectConfiguration.total_limit``) complete checkpoints, never
        deleting the new one nor the one loaded last.

        Example:
            >>> import tempfile
            >>> accelerator = Accelerator(cpu=True, project_dir=tempfile.mkdtemp())
            >>> accelerator.save_state().endswith("checkpoint_0")
            True
        """
        if unsupported:
            raise TypeError(f"save_state() got unsupported arguments {sorted(unsupported)}; "
                            "accel always writes safetensors + JSON")
        project = self.project_configuration
        return str(save_run(self._comm, self._snapshot(), output_dir, total_limit,
                            project.project_dir, project.total_limit))

    def load_state(self, input_dir: str | None = None, strict: bool = True,
                   missing_ok: bool = False) -> str | None:
        """Restore a checkpoint on every rank; without ``input_dir`` the newest complete one.

        Afterwards iterating a prepared loader continues with the next unseen batch and the RNG
        streams continue where they were, so training resumes exactly. A missing or corrupt
        component raises ``CheckpointError`` naming the file on every rank; ``strict=False``
        skips it with a warning on each affected rank. ``missing_ok=True`` (without
        ``input_dir``) returns None when no complete checkpoint exists yet, so one script both
        starts fresh and resumes after ``accel launch --max_restarts N`` restarted it.

        Example:
            >>> import tempfile
            >>> accelerator = Accelerator(cpu=True, project_dir=tempfile.mkdtemp())
            >>> accelerator.load_state(missing_ok=True) is None
            True
        """
        loaded = load_run(self._comm, self._snapshot(), input_dir,
                          self.project_configuration.project_dir, strict, missing_ok)
        if loaded is None:
            return None
        self._accumulation.step = loaded.accumulation_step
        for opt in self._prep.optimizers:
            opt.steps_taken = loaded.optimizer_steps
        self._loaded_dir = loaded.path
        return str(loaded.path)

    def save(self, obj: Any, f: str, safe_serialization: bool = True) -> None:
        """Save a state dict or module as safetensors (main process only, atomic)."""
        if not safe_serialization and self.is_main_process:
            warnings.warn("save(safe_serialization=False) is ignored: accel always writes "
                          "safetensors (no pickle), whatever the file extension", stacklevel=2)
        if self.is_main_process:
            _ckpt_files.save(self.unwrap_model(obj) if isinstance(obj, nn.Module) else obj, f)

    def save_model(self, model: nn.Module, save_directory: str,
                   max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
        """Sharded safetensors with a Hugging Face style index (main process only)."""
        if self.is_main_process:
            _ckpt_files.save_model(self.get_state_dict(model), save_directory, max_shard_size)

    def load_model(self, model: nn.Module, load_directory: str, strict: bool = True) -> Any:
        """Load weights written by ``save_model`` (or ``save``) into ``model``."""
        return _ckpt_files.load_model(self.unwrap_model(model), load_directory, strict=strict)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        return dict((self.unwrap_model(model) if unwrap else model).state_dict())

    # -- memory --------------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop accel's references to prepared objects and release cached device memory."""
        self._prep.clear()
        return release_memory(*objects)

    clear = free_memory

    def end_training(self) -> None:
        """Finish trackers and end the process group accel started."""
        self._trackers.end_training()
        self.wait_for_everyone()
        self._monitor.close()
        self._group.close()


class _UnwrappedModelIO:
    """ModelStateIO through unwrap_module, until strategies implement it (issue 13)."""

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return dict(unwrap_module(model).state_dict())

    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor],
                              strict: bool) -> Any:
        return unwrap_module(model).load_state_dict(state, strict=strict)


Accelerator.send_to_device = staticmethod(send_to_device)  # type: ignore[attr-defined]
