"""The checkpoint part of the ``Accelerator`` facade: what is saved, by whom, and the hooks.

``Accelerator`` inherits these methods; they delegate to the checkpoint protocol (with a
snapshot of the run state) and to the strategy (for full model state dicts), and keep no state
of their own: registered objects and hooks live in the run state.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .._base import tree as _tree
from .._base.warn import warn_user
from ..checkpoint import check_registrable, load_run, save_run
from ..checkpoint.storage import files as _ckpt_files
from ..run.connector import Options, Runtime
from ..run.state import RunState

__all__ = ["CheckpointingMixin", "NotRegistrableError"]


class NotRegistrableError(TypeError, ValueError):
    """``register_for_checkpointing`` got objects without ``state_dict``/``load_state_dict``.

    A ``TypeError`` (the objects are of the wrong kind) and a ``ValueError`` (what Accelerate
    raises here); the message names every such item by its index.
    """


class CheckpointingMixin:
    """``save_state``/``load_state``, their hooks, and single-file ``save``/``save_model``."""

    _rt: Runtime
    _run: RunState
    _options: Options

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include objects with ``state_dict``/``load_state_dict`` in ``save_state``.

        Their state may hold tensors, numpy arrays, numbers, strings and containers of them (it
        is stored as safetensors + JSON, never pickled). They are matched by position: register
        the same objects in the same order before ``load_state``.

        Raises:
            NotRegistrableError: some objects lack those methods (a ``TypeError`` and a
                ``ValueError``, naming each by its index); then none of them is registered.

        Example:
            >>> class Step:
            ...     def __init__(self): self.n = 0
            ...     def state_dict(self): return {"n": self.n}
            ...     def load_state_dict(self, state): self.n = state["n"]
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> accelerator.register_for_checkpointing(Step())
        """
        checked: list[Any] = []
        invalid: list[str] = []
        for index, obj in enumerate(objects):
            try:
                checked.append(check_registrable(obj))
            except TypeError as exc:
                invalid.append(f"Item at index {index} ({type(obj).__name__}): {exc}")
        if invalid:  # nothing is registered: fix the call and register them all again
            raise NotRegistrableError("register_for_checkpointing(): " + "; ".join(invalid))
        self._run.custom.extend(checked)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` on every rank before ``save_state`` writes.

        ``models`` are the prepared models, ``weights`` their state dicts (same order) and
        ``output_dir`` the directory being written. A hook that saves a model itself (e.g.
        ``save_pretrained(os.path.join(output_dir, "unet"))`` on the main process) pops its
        entry from ``weights``; what it writes there becomes part of the atomic checkpoint
        (listed and hashed in its manifest). Returns a handle whose ``remove()`` unregisters it.

        Example:
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> handle = accelerator.register_save_state_pre_hook(lambda m, w, d: None)
            >>> handle.remove()
        """
        return self._register_hook(self._run.save_hooks, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` on every rank before ``load_state`` loads models.

        A hook that loads a model itself pops it from ``models``; the others are loaded by
        accel in order. Returns a handle whose ``remove()`` unregisters it.
        """
        return self._register_hook(self._run.load_hooks, hook)

    @staticmethod
    def _register_hook(hooks: OrderedDict[int, Any], hook: Callable[..., None]
                       ) -> RemovableHandle:
        if not callable(hook):
            raise TypeError(f"a state hook must be callable, got {type(hook).__name__}")
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def save_state(self, output_dir: str | None = None, total_limit: int | None = None,
                   safe_serialization: bool = True, *, blocking: bool = True,
                   **unsupported: Any) -> str:
        """Save everything prepared or registered, atomically and without pickle.

        Models, optimizers, schedulers, the fp16 scaler, registered objects, each rank's RNG
        states and each prepared loader's position. Call it on every rank, or, as Accelerate
        allows, on the main process only (``if accelerator.is_main_process:``, the diffusers
        scripts): the main process then finds out, without waiting on the others, that they
        are not coming, and writes the checkpoint alone (without the other ranks' RNG states
        and loader positions; ``load_state`` says so once and seeds those ranks from the step).
        Without ``output_dir`` it writes ``<project_dir>/checkpoints/checkpoint_<n+1>`` and keeps
        at most ``total_limit`` (or ``ProjectConfiguration.total_limit``) complete checkpoints,
        never deleting the new one nor the one loaded last.

        ``blocking=False`` (an accel extension; pass it on every rank) returns as soon as the
        state is copied to host memory, so the next optimizer step may change the parameters
        at once, and writes the checkpoint in the background, with the same atomicity: the
        returned directory appears complete, or not at all (a crash leaves the previous
        checkpoint the newest). The next ``save_state``, ``load_state``, ``end_training``,
        :meth:`wait_for_checkpoint` and the normal end of the script wait for it, and raise its
        error; rotation happens when it completes. Holds a host copy of the state until then.
        Under ``if accelerator.is_main_process:`` it blocks (one warning); FSDP's
        SHARDED_STATE_DICT is refused (save it blocking, or use FULL_STATE_DICT).

        With ``ProjectConfiguration(save_on_each_node=True)`` (machines without a shared
        filesystem) the local main process of every machine writes a complete copy of the
        checkpoint on its machine (its own ``output_dir``, or the same ``checkpoint_<n>`` name
        under its own ``project_dir``, rotated there), and ``load_state`` reads each machine's
        copy; machines that do share the directory write it once. A sharded (FSDP) state
        cannot be copied to each machine: that save raises, saying so.

        Example:
            >>> import tempfile
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True, project_dir=tempfile.mkdtemp())
            >>> accelerator.save_state().endswith("checkpoint_0")
            True
        """
        if unsupported:
            raise TypeError(f"save_state() got unsupported arguments {sorted(unsupported)}; "
                            "accel always writes safetensors + JSON")
        if not safe_serialization and self._rt.context.is_main_process:
            warn_user("save_state(safe_serialization=False) is ignored: accel checkpoints "
                      "are always safetensors + JSON (never pickle)")
        project, rt, run = self._options.project, self._rt, self._run
        if not isinstance(blocking, bool):
            raise TypeError(f"save_state(blocking=...) must be True or False, got {blocking!r}")
        run.saves.wait()  # before the snapshot: a failure of the last save raises here
        return str(save_run(rt.comm, snap=run.snapshot(rt.precision, rt.strategy, rt.hardware),
                            output_dir=output_dir, total_limit=total_limit,
                            project_dir=project.project_dir,
                            project_total_limit=project.total_limit,
                            attendance=rt.attendance, blocking=blocking, background=run.saves,
                            save_on_each_node=project.save_on_each_node))

    def wait_for_checkpoint(self) -> str | None:
        """Wait until the save a ``save_state(blocking=False)`` started is complete.

        Returns the checkpoint's directory, or None when no save was in flight. The next
        ``save_state``, ``load_state`` and ``end_training`` wait by themselves; call this
        where the checkpoint must exist (before copying it elsewhere, or to see a failure
        sooner). Call it on every rank, as ``save_state``.

        Raises:
            CheckpointError: the background part of the save failed (the cause is chained);
                the previous complete checkpoint is still the newest.

        Example:
            >>> import tempfile
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True, project_dir=tempfile.mkdtemp())
            >>> path = accelerator.save_state(blocking=False)
            >>> accelerator.wait_for_checkpoint() == path
            True
        """
        done = self._run.saves.wait()
        return None if done is None else str(done)

    def load_state(self, input_dir: str | None = None, strict: bool = True,
                   missing_ok: bool = False) -> str | None:
        """Restore a checkpoint on every rank; without ``input_dir`` the newest complete one.

        The RNG streams continue where they were. Prepared data loaders are left as they are,
        as in Accelerate (skip the batches already seen with ``skip_first_batches``), unless
        ``DataLoaderConfiguration(use_stateful_dataloader=True)``: then iterating a loader
        continues with the next unseen batch, so training resumes exactly. A missing or corrupt
        component raises ``CheckpointError`` naming the file on every rank; ``strict=False``
        skips it with a warning on each affected rank. ``missing_ok=True`` (without
        ``input_dir``) returns None when no complete checkpoint exists yet, so one script both
        starts fresh and resumes after ``accel launch --max_restarts N`` restarted it. With
        ``ProjectConfiguration(save_on_each_node=True)`` every rank reads the copy on its own
        machine (as Accelerate does), after the ranks agree that each machine has it.

        Example:
            >>> import tempfile
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True, project_dir=tempfile.mkdtemp())
            >>> accelerator.load_state(missing_ok=True) is None
            True
        """
        rt = self._rt
        self._run.saves.wait()  # the newest checkpoint may be the one still being written
        project = self._options.project
        loaded = load_run(rt.comm, snap=self._run.snapshot(rt.precision, rt.strategy, rt.hardware),
                          input_dir=input_dir, project_dir=project.project_dir, strict=strict,
                          missing_ok=missing_ok,
                          save_on_each_node=project.save_on_each_node)
        if loaded is None:
            return None
        self._run.restored(loaded.path, loaded.accumulation_step, loaded.optimizer_steps)
        return str(loaded.path)

    def save(self, obj: Any, f: str | os.PathLike[str],
             safe_serialization: bool | None = None) -> None:
        """Save ``obj`` to ``f`` on the main process, atomically (a module: its state dict).

        With ``ProjectConfiguration(save_on_each_node=True)`` the local main process of every
        machine writes it (as Accelerate's ``save``), for machines without a shared filesystem.

        ``safe_serialization=True`` writes safetensors (tensors only); ``False`` writes what
        Accelerate's default writes, ``torch.save``'s format, for scripts that read the file
        with ``torch.load`` (keep it to tensors and plain values so that
        ``torch.load(f, weights_only=True)`` reads it). Left out, the file name decides:
        ``*.safetensors`` gets safetensors, anything else ``torch.save``'s format, as in
        Accelerate. ``save_state`` checkpoints are always safetensors + JSON, whatever this.

        Example:
            >>> import os, tempfile, torch
            >>> from accel import Accelerator
            >>> accelerator = Accelerator(cpu=True)
            >>> folder = tempfile.mkdtemp()
            >>> accelerator.save({"epoch": 3}, os.path.join(folder, "extra.pt"))
            >>> torch.load(os.path.join(folder, "extra.pt"), weights_only=True)
            {'epoch': 3}
        """
        _refuse_shards(obj, sharded_models=self._rt.strategy.distributed_state)
        if not self._writes_files():
            return
        if isinstance(obj, nn.Module):
            obj = self._rt.strategy.model_state_dict(obj)
        if safe_serialization is None:
            safe_serialization = os.fspath(f).endswith(".safetensors")
        if safe_serialization:
            _ckpt_files.save(obj, Path(f))
        else:
            _ckpt_files.save_torch(obj, Path(f))

    def save_model(self, model: nn.Module, save_directory: str,
                   max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
        """Sharded safetensors with a Hugging Face style index, written by the main process.

        ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` files of at most
        ``max_shard_size`` plus ``model.safetensors.index.json``. A sharded (FSDP) model is
        gathered one tensor at a time and each file written as soon as it is full, so no
        process ever holds the whole model: call it on every process then (a collective).
        With ``ProjectConfiguration(save_on_each_node=True)`` the local main process of every
        machine writes the files (an FSDP model's too), as Accelerate's ``save_model`` does.
        """
        strategy, main = self._rt.strategy, self._rt.context.is_main_process
        writes = self._writes_files()
        if not safe_serialization and main:
            warn_user("save_model(safe_serialization=False) is ignored: accel writes "
                      "safetensors only (pickle files can run code when loaded)")
        if strategy.distributed_state:
            from ..checkpoint.sharded.consolidate import save_model_streamed  # imports DCP

            save_model_streamed(strategy.state_module(model), directory=save_directory,
                                max_shard_size=max_shard_size,
                                write=writes)
        elif writes:
            _ckpt_files.save_model(self.get_state_dict(model), save_directory=save_directory,
                                   max_shard_size=max_shard_size)

    def _writes_files(self) -> bool:
        """Whether this process writes ``save``/``save_model`` files: the main process, or
        with ``save_on_each_node`` each machine's local main process (Accelerate's rule)."""
        ctx = self._rt.context
        return ctx.is_local_main_process if self._options.project.save_on_each_node \
            else ctx.is_main_process

    def load_model(self, model: nn.Module, load_directory: str, strict: bool = True) -> Any:
        """Load weights written by ``save_model`` (or ``save``) into ``model``."""
        return _ckpt_files.load_model(self._rt.strategy.unwrap(model),
                                      directory=load_directory, strict=strict)

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict (gathered by the strategy when it is sharded; for a model
        dispatched with CPU/disk offload, its offloaded weights read back onto the CPU)."""
        state = self._rt.strategy.model_state_dict(model) if unwrap else dict(model.state_dict())
        return _with_offloaded_weights(self._rt.strategy.unwrap(model) if unwrap else model,
                                       state)


def _with_offloaded_weights(model: nn.Module, state: dict[str, torch.Tensor]
                            ) -> dict[str, torch.Tensor]:
    """``state`` with the meta placeholders of offloaded modules replaced by their weights.

    A module dispatched with offload (``dispatch_model``/``load_checkpoint_and_dispatch`` with
    "cpu"/"disk" in the device map) holds meta tensors between forwards; its hook (the
    ``_hf_hook`` with ``offload=True``) materialises them in ``pre_forward`` and drops them in
    ``post_forward``. Each such module's state is read between the two, as CPU copies.
    """
    for name, module in model.named_modules():
        hook = module.__dict__.get("_hf_hook")
        if not getattr(hook, "offload", False):
            continue
        prefix = f"{name}." if name else ""
        hook.pre_forward(module)
        try:
            state.update({prefix + key: value.detach().to("cpu", copy=True)
                          for key, value in module.state_dict().items()})
        finally:
            hook.post_forward(module, None)
    return state


def _refuse_shards(obj: Any, *, sharded_models: bool) -> None:
    """``save`` writes what the main process holds; FSDP shards (DTensors) are a part of a
    tensor, and gathering them needs every rank, so they are refused with the way to do it."""
    shards: list[str] = []
    if isinstance(obj, nn.Module):
        if sharded_models:
            shards.append(type(obj).__name__)
    else:
        _tree.apply(lambda t: shards.append("x") if hasattr(t, "full_tensor") else None, data=obj)
    if shards:
        raise ValueError("accelerator.save() got the shards of an FSDP model (DTensors): call "
                         "state = accelerator.get_state_dict(model) on every rank (the full "
                         "tensors land on the main process) and save that, or use "
                         "accelerator.save_model(model, directory)")
