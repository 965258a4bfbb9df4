"""Accelerate's ``accelerate.utils.environment``: patching, clearing and checking the process
environment.

Every change to ``os.environ`` goes through :mod:`accel.env` (``patched``, ``preserved``);
this module only gives them Accelerate's names and signatures.

Example:
    >>> import os
    >>> with patch_environment(accel_doc_example=1):
    ...     os.environ["ACCEL_DOC_EXAMPLE"]
    '1'
    >>> convert_dict_to_env_variables({"ACCEL_DEBUG_MODE": "1"})
    ['ACCEL_DEBUG_MODE=1\\n']
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from .. import env

__all__ = ["clear_environment", "convert_dict_to_env_variables", "patch_environment",
           "purge_accelerate_environment"]

#: The variables ``purge_accelerate_environment`` restores: Accelerate's and accel's own.
PURGED_PREFIXES = ("ACCELERATE_", "ACCEL_")
#: Characters that ``convert_dict_to_env_variables`` refuses in a name or a value.
FORBIDDEN_CHARACTERS = (";", "\n", "<", ">", " ")
#: Marks a test method that ``purge_accelerate_environment`` has wrapped already.
_PURGED = "_accel_purges_environment"

_T = TypeVar("_T")


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables for the block (names upper-cased, values ``str()``-ed), then
    restore what was there before, also when the block raises.

    Example:
        >>> import os
        >>> with patch_environment(accel_doc_example=1):
        ...     os.environ["ACCEL_DOC_EXAMPLE"]
        '1'
        >>> "ACCEL_DOC_EXAMPLE" in os.environ
        False
    """
    with env.patched({name.upper(): str(value) for name, value in kwargs.items()}):
        yield


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty process environment, then put the previous one back exactly
    (variables set in the block are removed, changed ones restored), also when it raises.

    Example:
        >>> import os
        >>> with clear_environment():
        ...     os.environ["ACCEL_DOC_EXAMPLE"] = "1"
        ...     sorted(os.environ)
        ['ACCEL_DOC_EXAMPLE']
        >>> "ACCEL_DOC_EXAMPLE" in os.environ
        False
    """
    with env.preserved(("",), clear=True):
        yield


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """``NAME=value\\n`` lines for the variables of ``current_env`` that are safe to write to an
    environment file: a variable whose name or value is empty or contains ``;``, a newline,
    ``<``, ``>`` or a space is left out, with a warning on the ``accel.utils.environment``
    logger.

    Example:
        >>> convert_dict_to_env_variables({"OK": "1", "BAD": "<x", "ALSO_OK": "2"})
        ['OK=1\\n', 'ALSO_OK=2\\n']
    """
    logger = logging.getLogger("accel.utils.environment")
    lines = []
    for name, value in current_env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"convert_dict_to_env_variables: environment variables are strings; "
                            f"got {name!r}={value!r} (convert the value with str())")
        if name and value and not any(c in name + value for c in FORBIDDEN_CHARACTERS):
            lines.append(f"{name}={value}\n")
        else:
            logger.warning("Skipping %s=%s: a name and a value must be non-empty and contain "
                           "none of ';', '<', '>', a space or a newline", name, value)
    return lines


def _purging(func: Callable[..., _T]) -> Callable[..., _T]:
    """``func`` run so that the ``ACCELERATE_*``/``ACCEL_*`` variables are as before after it."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        with env.preserved(PURGED_PREFIXES):
            return func(*args, **kwargs)

    setattr(wrapper, _PURGED, True)
    return wrapper


def _purge_test_methods(cls: type) -> None:
    """Wrap each ``test*`` method of ``cls`` (inherited ones included) with :func:`_purging`."""
    for name in dir(cls):
        if not name.startswith("test"):
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, (staticmethod, classmethod)):
            if not getattr(raw.__func__, _PURGED, False):
                setattr(cls, name, type(raw)(_purging(raw.__func__)))
        elif callable(raw) and not getattr(raw, _PURGED, False):
            setattr(cls, name, _purging(raw))


def _purge_subclasses(cls: type) -> None:
    """Make every subclass of ``cls`` wrap its test methods too (the class's own
    ``__init_subclass__``, or the inherited one, still runs first)."""
    own = cls.__dict__.get("__init_subclass__")

    def init_subclass(sub: type, /, **kwargs: Any) -> None:
        mro = sub.__mro__
        hooks = [own] if own is not None else \
            [klass.__dict__.get("__init_subclass__") for klass in mro[mro.index(cls) + 1:]]
        next(hook for hook in hooks if hook is not None).__get__(None, sub)(**kwargs)
        _purge_test_methods(sub)

    setattr(cls, "__init_subclass__", classmethod(init_subclass))  # noqa: B010


def purge_accelerate_environment(func_or_cls: _T) -> _T:
    """Decorator: after the function (or each ``test*`` method of the class and of its
    subclasses) returns or raises, the ``ACCELERATE_*`` and ``ACCEL_*`` environment variables
    are as they were before it: new ones removed, changed or removed ones put back.

    For tests of code that exports such variables and leaves them behind (Accelerate's example:
    ``transformers.TrainingArguments(fp16=True)`` sets ``ACCELERATE_MIXED_PRECISION``), so that
    one test does not change the next. Works on ``unittest.TestCase`` and plain pytest classes;
    unittest and pytest markers on the class or its methods keep working.

    Example:
        >>> import os
        >>> @purge_accelerate_environment
        ... def configure():
        ...     os.environ["ACCEL_DOC_EXAMPLE"] = "fp16"
        >>> configure()
        >>> "ACCEL_DOC_EXAMPLE" in os.environ
        False
    """
    if not isinstance(func_or_cls, type):
        if not callable(func_or_cls):
            raise TypeError("purge_accelerate_environment decorates a function or a class, "
                            f"got {type(func_or_cls).__name__}; use it as a decorator "
                            "(@purge_accelerate_environment)")
        return _purging(func_or_cls)  # type: ignore[return-value]
    _purge_test_methods(func_or_cls)
    _purge_subclasses(func_or_cls)
    return func_or_cls
