"""torchdata's ``StatefulDataLoader`` as an optional extra base class of accel's loaders.

With ``DataLoaderConfiguration(use_stateful_dataloader=True)`` accel's prepared loaders resume
exactly by themselves. When torchdata is installed (``pip install accel[stateful]``) they are
also instances of ``torchdata.stateful_dataloader.StatefulDataLoader``, as Accelerate's are,
for scripts that check ``isinstance(loader, StatefulDataLoader)``. The class that says so is
made here, once per process and base class: it derives from accel's class first (whose
iteration, sharding, ``state_dict`` and ``load_state_dict`` it keeps) and from
``StatefulDataLoader`` second. torchdata is imported only when such a class is asked for.

Example:
    >>> class Loader:
    ...     def __init__(self) -> None:
    ...         self.items = [1, 2]
    >>> cls = stateful_variant(Loader)
    >>> cls is None or (issubclass(cls, Loader) and cls.__name__ == "StatefulLoader")
    True
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Hashable
from typing import Any, TypeVar, cast

__all__ = ["stateful_dataloader_class", "stateful_variant"]

_T = TypeVar("_T")


def stateful_dataloader_class() -> type[Any] | None:
    """torchdata's ``StatefulDataLoader``, or ``None`` when torchdata is not installed.

    Example:
        >>> cls = stateful_dataloader_class()
        >>> cls is None or cls.__name__ == "StatefulDataLoader"
        True
    """
    try:
        module = importlib.import_module("torchdata.stateful_dataloader")
    except ImportError:
        return None
    found = getattr(module, "StatefulDataLoader", None)
    return found if isinstance(found, type) else None


def stateful_variant(base: type[_T]) -> type[_T] | None:
    """A subclass of ``base`` that is also a torchdata ``StatefulDataLoader`` (``None``
    without torchdata); the same class on every call for the same ``base``.

    ``base`` comes first in the new class's bases, so all of its methods (iteration, length,
    ``state_dict``, ...) win over ``StatefulDataLoader``'s; ``StatefulDataLoader.__init__``
    runs only when ``base.__init__`` calls ``super().__init__``. Instances pickle (and
    ``deepcopy``) as instances of the same variant, or of ``base`` where torchdata is missing.
    """
    stateful = stateful_dataloader_class()
    if stateful is None:
        return None
    if issubclass(base, stateful):
        return base
    combined: type[_T] = _combine(cast("Hashable", base), cast("Hashable", stateful))
    return combined


@functools.cache
def _combine(base: Any, stateful: Any) -> Any:
    """The one class deriving from ``base`` then ``stateful`` (cached: ``isinstance`` and
    pickling need the same class every time)."""
    name = f"Stateful{base.__name__}"
    namespace = {
        "__module__": base.__module__,
        "__qualname__": name,
        "__doc__": f"``{base.__name__}`` that is also torchdata's ``StatefulDataLoader`` "
                   f"(see ``{base.__module__}.{base.__qualname__}``).",
        "__reduce__": _reduce,
        "_stateful_base": base,
    }
    return type(name, (base, stateful), namespace)


def _reduce(self: Any) -> tuple[Any, ...]:
    # The combined class is made at run time and found by no import path: rebuild it.
    return _rebuild, (type(self)._stateful_base, dict(vars(self)))


def _rebuild(base: type[Any], state: dict[str, Any]) -> Any:
    """An instance of ``base``'s stateful variant (``base`` without torchdata) holding
    ``state`` (``__init__`` is not run, as for any unpickled object)."""
    cls = stateful_variant(base) or base
    instance = object.__new__(cls)
    vars(instance).update(state)
    return instance
