"""``save_state(blocking=False)``: the part of a save that finishes after the call returned.

The foreground part of a non-blocking save does everything that involves the training process
group (roll call, target planning, the state dicts' own collectives) and copies every tensor
of the state to host memory (:func:`host_copy`), so training may change its parameters at
once. What is left runs on one background thread per :class:`BackgroundSaves`: waiting for the
files, exchanging file records and the outcome among the ranks, and rank 0's manifest, rename
and rotation. Those exchanges run on a separate gloo group of every rank, created once,
collectively, by the foreground (:meth:`BackgroundSaves.side_group`), never on the training
group: a collective issued there by a thread would interleave differently with training's
collectives on each rank (the way PyTorch DCP's ``async_save`` does it).

At most one save is in flight. :meth:`BackgroundSaves.wait` (the next ``save_state``,
``load_state``, ``end_training``, ``wait_for_checkpoint``) waits for it and raises its error
with the cause; the normal end of the interpreter waits for it too (the thread is not a daemon)
and, if it failed, prints the error and ends the process with status 1.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> saves = BackgroundSaves()
    >>> saves.start(Path(tempfile.mkdtemp()) / "checkpoint_0", lambda: None)
    >>> saves.wait().name
    'checkpoint_0'
    >>> saves.wait() is None  # nothing pending
    True
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..._base import tree as _tree
from ...distributed import Communicator
from ...distributed.group import new_subgroup
from ..storage import CheckpointError

__all__ = ["BackgroundSaves", "HostStaging", "host_copy"]


def host_copy(state: Any, staging: HostStaging | None = None) -> Any:
    """A copy of ``state`` that shares no memory with it: tensors copied to the CPU (a CPU
    tensor too; into ``staging``'s reused buffers when given), numpy arrays copied, containers
    rebuilt; other values are immutable and kept. Tensors that are the same view of the same
    memory (tied weights) get one copy, so they stay tied.

    Example:
        >>> import torch
        >>> w = torch.zeros(2)
        >>> copy = host_copy({"w": w, "tied": w, "n": 1})
        >>> _ = w.add_(1)
        >>> copy["w"].tolist(), copy["n"], copy["tied"] is copy["w"]
        ([0.0, 0.0], 1, True)
    """
    staging = staging or HostStaging(reuse=False)
    seen: dict[tuple[Any, ...], torch.Tensor] = {}

    def tensor(state: torch.Tensor) -> torch.Tensor:
        t = state.detach()
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               t.stride(), t.dtype)
        if key not in seen:
            seen[key] = staging.copy(t)
        return seen[key]

    return _tree.apply(tensor, data=state,
                       other=lambda value: value.copy() if isinstance(value, np.ndarray) else value)


class HostStaging:
    """Host buffers that the copies of one save go into, reused by the next save.

    Copying into fresh memory costs far more than the copy itself (allocation and the first
    touch of every page: ~20x on a CPU, measured), so a save takes its buffers from the last
    one's (same shape and dtype) once that save is finished (:meth:`release`). Between saves
    the buffers hold one host copy of the state; :meth:`clear` frees them.
    """

    def __init__(self, reuse: bool = True) -> None:
        self.reuse = reuse
        self._free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._used: list[torch.Tensor] = []

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous CPU copy of ``tensor`` (in a reused buffer when one fits)."""
        free = self._free.get((tuple(tensor.shape), tensor.dtype))
        if free:
            out = free.pop().copy_(tensor)
        else:
            out = tensor.to("cpu", memory_format=torch.contiguous_format, copy=True)
        if self.reuse:
            self._used.append(out)
        return out

    def release(self) -> None:
        """The save that used the buffers is finished (nothing reads them any more)."""
        for buffer in self._used:
            self._free.setdefault((tuple(buffer.shape), buffer.dtype), []).append(buffer)
        self._used = []

    def clear(self) -> None:
        """Free the buffers no save uses."""
        self._free = {}


class BackgroundSaves:
    """The save a ``save_state(blocking=False)`` left running, and the gloo group it uses.

    One per run (the ``Accelerator``'s run state owns it). Not thread-safe: the training
    thread starts and waits; only the job runs on the background thread.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._target: Path | None = None
        self._error: BaseException | None = None
        self._group: Any = None
        self._said: set[str] = set()
        #: the host buffers of the save in flight, reused by the next one
        self.staging = HostStaging()

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy in another process (a DataLoader worker that captured the Accelerator) has no
        # save of this process in flight and no share in its process groups.
        return (BackgroundSaves, ())

    @property
    def pending(self) -> Path | None:
        """The checkpoint being finished in the background (None: none)."""
        return self._target if self._thread is not None else None

    def host_copy(self, state: Any) -> Any:
        """:func:`host_copy` into this run's reused buffers (the save in flight must be
        finished: :meth:`wait` first)."""
        return host_copy(state, self.staging)

    def once(self, key: str) -> bool:
        """True the first time ``key`` is asked (for one-time warnings)."""
        first = key not in self._said
        self._said.add(key)
        return first

    def side_group(self, comm: Communicator) -> Any:
        """The gloo group of every rank for background exchanges (None at world size 1).

        Created at the first call, which must be collective: every rank calls it at the same
        point (the foreground of a save every rank takes part in)."""
        if not comm.ctx.is_distributed:
            return None
        if self._group is None:
            self._group = new_subgroup(range(comm.ctx.world_size), backend="gloo")
        return self._group

    def start(self, target: Path, job: Callable[[], BaseException | None]) -> None:
        """Run ``job`` (returns the save's error, or None) on the background thread."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint save is still in flight; wait() for it first")

        def run() -> None:
            try:
                self._error = job()
            except BaseException as exc:  # noqa: BLE001 - raised by wait() on the training thread
                self._error = exc

        self._target, self._error = target, None
        self._thread = threading.Thread(target=run, name=f"accel-save-{target.name}")
        atexit.register(self._at_exit)  # after the process group's: runs before it
        self._thread.start()

    def wait(self) -> Path | None:
        """Wait for the save in flight; returns its checkpoint (None: there was none).

        Raises:
            CheckpointError: the background part failed (the cause is chained); the checkpoint
                does not exist and the previous complete one is still the newest.
        """
        thread = self._thread
        if thread is None:
            self.staging.release()  # no save reads them (one that failed at the call, say)
            return None
        thread.join()
        self.staging.release()
        target, error = self._target, self._error
        self._thread, self._target, self._error = None, None, None
        atexit.unregister(self._at_exit)
        if error is not None:
            raise CheckpointError(
                f"the checkpoint {target} that save_state(blocking=False) was finishing in the "
                f"background failed: {error}; it was not written (the previous complete "
                "checkpoint is still the newest), fix the cause and save again",
                path=target) from error
        return target

    def _at_exit(self) -> None:
        """The interpreter ends with a save in flight (no wait point reached): finish it; a
        failure is printed and ends the process with status 1, so a launcher sees it."""
        try:
            self.wait()
        except CheckpointError:
            print("[accel] " + "".join(traceback.format_exc()), file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
