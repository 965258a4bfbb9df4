"""The tracker interface: :class:`GeneralTracker`, the ``on_main_process`` decorator, and the
value conversions every tracker shares (``accel.tracking`` re-exports the public names).

It sits apart from ``accel.tracking`` so that the trackers of other services
(``accel.tracking.services``) can subclass it while ``accel.tracking`` lists them all.

Example:
    >>> class Quiet(GeneralTracker):
    ...     name = "quiet"
    ...     def log(self, values, step=None, **kwargs):
    ...         pass
    >>> tracker = Quiet()
    >>> tracker.start()  # the default opens nothing
    >>> tracker.tracker is tracker
    True
"""

from __future__ import annotations

import abc
import functools
import numbers
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

__all__ = ["GeneralTracker", "Scalar", "on_main_process"]

Scalar = bool | int | float | str


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a tracker method so that it runs on the main process only, when the tracker's
    ``main_process_only`` attribute is true (Accelerate's decorator for custom trackers).

    The rank is read when the method is called (from the launcher environment), so decorating
    needs no ``Accelerator``; elsewhere the method returns None.

    Example:
        >>> class Printer:
        ...     main_process_only = True
        ...     @on_main_process
        ...     def log(self, values):
        ...         print(values)
        >>> Printer().log({"loss": 1.0})  # a plain `python` run is rank 0
        {'loss': 1.0}
    """
    @functools.wraps(function)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False):
            from ..env import detect_launch  # stdlib only; read at call time

            if detect_launch().rank != 0:
                return None
        return function(self, *args, **kwargs)

    return run


class GeneralTracker(abc.ABC):
    """Base class for trackers: subclass it to send metrics anywhere.

    Set the class attributes ``name`` (what ``log_with``/``get_tracker`` call it) and
    ``requires_logging_directory``; implement ``log``; override ``start``,
    ``store_init_configuration``, ``finish`` and ``tracker`` as needed. ``init_trackers`` calls
    ``start()`` then ``store_init_configuration(config)`` on the processes where the tracker
    runs. ``main_process_only = False`` makes accel call the tracker on every rank (pass an
    instance in ``log_with``; built on each rank by you).

    Example:
        >>> from accel.tracking import init_trackers
        >>> class PrintTracker(GeneralTracker):
        ...     name = "print"
        ...     def log(self, values, step=None, **kwargs):
        ...         print(step, values)
        >>> run = init_trackers([PrintTracker()], "demo", is_main=True)
        >>> run.log({"loss": 1.5}, step=2)
        2 {'loss': 1.5}
    """

    name: ClassVar[str] = ""
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = True

    def start(self) -> None:
        """Open the run (called once by ``init_trackers``, before ``store_init_configuration``,
        only where the tracker runs: trackers of services create their run here, not in
        ``__init__``, so that building one on every rank starts nothing)."""

    def store_init_configuration(self, config: Mapping[str, Any]) -> None:
        """Record the run's hyper-parameters (called once by ``init_trackers``)."""

    @abc.abstractmethod
    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (0-d tensors already converted to Python numbers) at ``step``."""

    def finish(self) -> None:
        """Flush and close (called by ``end_training``)."""

    @property
    def tracker(self) -> Any:
        """The underlying object (``get_tracker(name, unwrap=True)`` returns it)."""
        return self


def _to_python(value: Any) -> Any:
    """0-d tensors / numpy scalars -> Python scalars; anything else unchanged."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return value


def _scalar(key: str, value: Any, tracker: str) -> Scalar:
    value = _to_python(value)
    if isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, numbers.Real):  # e.g. numpy.float32, fractions
        return float(value)
    shape = getattr(value, "shape", None)
    hint = f" of shape {tuple(shape)}" if shape is not None else ""
    raise TypeError(
        f"{tracker} tracker: values[{key!r}] is a {type(value).__name__}{hint}; expected a "
        "number, a string or a 0-d tensor (log e.g. loss.item() or t.mean())"
    )
