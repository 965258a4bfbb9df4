"""Parameter-server tables in an ``Accelerator``'s checkpoints.

``checkpoint_with(accelerator)`` registers a save and a load pre-hook (Accelerate's hook API,
which runs on every worker with the directory being written: the checkpoint's temporary
directory, so the servers' files are part of the atomic checkpoint and its manifest):

- save: every worker waits for its pushes in flight (``geo``: pushes its local changes), the
  workers meet, then worker 0 asks every server to write its shard of every table as
  ``ps/<table>/shard-<i>-of-<S>.safetensors`` (global ids, rows and per-row optimizer state;
  no pickle) and waits for them. The checkpoint's manifest then lists and hashes those files.
- load: the workers drop what they cached, worker 0 asks every server to restore its rows from
  all the shard files of each table (written by any number of servers: each server takes the
  rows it owns now, so a checkpoint of 2 servers loads into 1), and the workers meet again so
  that nobody pulls before the rows are back.

The servers write into the directory the workers name: on several machines it must be shared
storage, as for the workers' own checkpoint files.
"""

from __future__ import annotations

from typing import Any, Protocol

from . import _remote, _session

__all__ = ["checkpoint_with"]


class _Accelerator(Protocol):
    is_main_process: bool

    def wait_for_everyone(self) -> None: ...

    def register_save_state_pre_hook(self, hook: Any) -> Any: ...

    def register_load_state_pre_hook(self, hook: Any) -> Any: ...


def _servers(session: _session.Session, fn: Any, directory: str) -> None:
    futures = [(s, session.call(s, fn, directory)) for s in range(session.role.server_num)]
    for s, future in futures:
        session.wait(s, future)


def checkpoint_with(accelerator: _Accelerator) -> tuple[Any, Any]:
    """Save and restore the parameter servers' tables with ``accelerator.save_state`` /
    ``load_state``; returns the two hook handles (``.remove()`` undoes it).

    Example:
        >>> from accel import Accelerator, ps
        >>> handles = ps.checkpoint_with(Accelerator(cpu=True))
    """
    session = _session.current()

    def save_hook(models: Any, weights: Any, output_dir: str) -> None:
        for table in session.live_tables():
            table.flush()
            table.push_deltas()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _servers(session, _remote.save_shards, output_dir)

    def load_hook(models: Any, input_dir: str) -> None:
        for table in session.live_tables():
            table.flush()
            table.reset_cache()
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _servers(session, _remote.load_shards, input_dir)
        accelerator.wait_for_everyone()

    return (accelerator.register_save_state_pre_hook(save_hook),
            accelerator.register_load_state_pre_hook(load_hook))
