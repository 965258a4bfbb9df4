"""Process control of the facade: run a block or a function on some processes only.

The ordering blocks wait on the c10d store (:func:`accel.distributed.sync.leader_first`), not in
a collective, so a long download on the main process does not trip the others' timeout. The
decorators return the function itself where it runs, and a function that does nothing on the
other processes. :func:`only_where` and :func:`process_filter` are shared with the
``PartialState`` view of the compatibility layer.

Example:
    >>> from accel import Accelerator
    >>> accelerator = Accelerator(cpu=True)
    >>> with accelerator.main_process_first():
    ...     accelerator.on_main_process(lambda: "ran")()
    'ran'
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from ..distributed.sync import leader_first, split_for_rank
from ..env.log import main_print
from ..run.connector import Runtime

__all__ = ["ProcessMixin", "only_where", "process_filter"]


def _skip(*args: Any, **kwargs: Any) -> None:
    """What ``on_main_process`` and friends return on the other ranks: does nothing."""


def only_where(runs: bool, *, distributed: bool, function: Callable[..., Any]
               ) -> Callable[..., Any]:
    """``function`` where it ``runs`` (or in a job of one process), else a no-op with its name."""
    if runs or not distributed:
        return function
    return functools.wraps(function)(_skip)


def process_filter(decorate: Callable[..., Any], *, function: Callable[..., Any] | None,
                   index: int | None, what: str) -> Any:
    """``on_process``/``on_local_process``: usable as ``@obj.on_process(process_index=1)``.

    ``decorate(function, index)`` builds the decorated function once both are known.

    Raises:
        ValueError: no index was given (naming the keyword ``what``).
    """
    if index is None:
        method = "on_" + what.removesuffix("_index")
        raise ValueError(f"{method} needs {what}=<rank>, e.g. @accelerator.{method}({what}=0)")
    if function is None:
        return functools.partial(decorate, **{what: index})
    return decorate(function, **{what: index})


class ProcessMixin:
    """Ordering blocks, input splitting, process-filtering decorators and ``print``."""

    _rt: Runtime

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on the main process first (others wait without a timeout)."""
        with leader_first(self._rt.context, store=self._rt.group.store()):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local main process first."""
        with leader_first(self._rt.context, store=self._rt.group.store(), local=True):
            yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False
                                ) -> Iterator[Any]:
        """Yield this rank's contiguous share of ``inputs`` (unchanged in one process).

        Shares differ by at most one item (earlier processes get the extra ones); with
        ``apply_padding`` every share is padded with the last item to the same length.
        """
        ctx = self._rt.context
        yield split_for_rank(ctx, inputs=inputs,
                             apply_padding=apply_padding) if ctx.is_distributed else inputs

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function`` to run on the main process only (a no-op elsewhere)."""
        ctx = self._rt.context
        return only_where(ctx.is_main_process, distributed=ctx.is_distributed, function=function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function`` to run on each node's local main process only."""
        ctx = self._rt.context
        return only_where(ctx.is_local_main_process, distributed=ctx.is_distributed,
                          function=function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate ``function`` to run on the last process only."""
        ctx = self._rt.context
        return only_where(ctx.is_last_process, distributed=ctx.is_distributed, function=function)

    def on_process(self, function: Callable[..., Any] | None = None,
                   process_index: int | None = None) -> Any:
        """Decorate ``function`` to run on process ``process_index`` only (in one process it
        always runs); use it as ``@accelerator.on_process(process_index=1)``."""
        ctx = self._rt.context
        return process_filter(
            lambda f, process_index: only_where(ctx.rank == process_index,
                                                distributed=ctx.is_distributed,
                                                function=f),
            function=function, index=process_index, what="process_index")

    def on_local_process(self, function: Callable[..., Any] | None = None,
                         local_process_index: int | None = None) -> Any:
        """Decorate ``function`` to run on local process ``local_process_index`` of each node."""
        ctx = self._rt.context
        return process_filter(
            lambda f, local_process_index: only_where(ctx.local_rank == local_process_index,
                                                      distributed=ctx.is_distributed, function=f),
            function=function, index=local_process_index, what="local_process_index")

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        main_print(self._rt.context.is_main_process, *args, **kwargs)
