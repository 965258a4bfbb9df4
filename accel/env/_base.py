"""The one module of accel that touches ``os.environ``, and the error for a bad environment.

Everything else in ``accel.env`` reads through ``current(environ)``, so that every reader takes
an optional ``environ`` mapping (tests describe a launcher without touching the real
environment), and ``accel.launch`` writes variables for its children through ``apply``.

Example:
    >>> current({"RANK": "1"})["RANK"]
    '1'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from .._base.parse import parse_float, parse_int

__all__ = ["LaunchEnvironmentError", "apply", "current", "int_variable", "optional_int",
           "patched", "preserved", "seconds_variable"]


class LaunchEnvironmentError(RuntimeError):
    """The launcher environment is inconsistent (half-set, or missing a rendezvous address)."""


def current(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``environ`` if given, else this process's environment."""
    return os.environ if environ is None else environ


def apply(variables: Mapping[str, str]) -> None:
    """Set ``variables`` in this process's environment (inherited by the processes it starts).

    Example:
        >>> apply({})
    """
    os.environ.update(variables)


@contextlib.contextmanager
def patched(variables: Mapping[str, str]) -> Iterator[None]:
    """Set ``variables`` in this process's environment for the block, then put back what was
    there before (a variable that was unset is removed again), also when the block raises.

    Example:
        >>> with patched({"ACCEL_DOC_EXAMPLE": "1"}):
        ...     current()["ACCEL_DOC_EXAMPLE"]
        '1'
        >>> "ACCEL_DOC_EXAMPLE" in current()
        False
    """
    for name, value in variables.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"environment variables are strings; got {name!r}={value!r} "
                            "(convert the value with str())")
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


@contextlib.contextmanager
def preserved(prefixes: tuple[str, ...] = ("",), *, clear: bool = False) -> Iterator[None]:
    """Put back, after the block, every variable whose name starts with one of ``prefixes`` as it
    was before (changed ones restored, new ones removed, removed ones set again), also when the
    block raises; ``("",)`` covers the whole environment. ``clear=True`` also removes those
    variables for the duration of the block.

    Example:
        >>> with preserved(("ACCEL_DOC_",)):
        ...     apply({"ACCEL_DOC_EXAMPLE": "1"})
        >>> "ACCEL_DOC_EXAMPLE" in current()
        False
    """
    if not isinstance(prefixes, tuple) or not all(isinstance(p, str) for p in prefixes):
        raise TypeError(f"prefixes must be a tuple of strings, got {prefixes!r} (write a single "
                        "prefix as (prefix,))")
    saved = {name: value for name, value in os.environ.items() if name.startswith(prefixes)}
    if clear:
        for name in saved:
            del os.environ[name]
    try:
        yield
    finally:
        for name in [name for name in os.environ if name.startswith(prefixes)]:
            if name not in saved:
                del os.environ[name]
        os.environ.update(saved)


def int_variable(environ: Mapping[str, str], name: str, minimum: int | None = None) -> int:
    """The integer in ``environ[name]``; ``LaunchEnvironmentError`` naming the variable if not."""
    raw = environ[name]
    try:
        value = parse_int(raw, name=name)
    except ValueError:
        raise LaunchEnvironmentError(
            f"environment variable {name}={raw!r} is not an integer; unset it or fix the launcher"
        ) from None
    if minimum is not None and value < minimum:
        raise LaunchEnvironmentError(f"{name}={value} must be >= {minimum}")
    return value


def optional_int(environ: Mapping[str, str], name: str, minimum: int | None = None) -> int | None:
    """``int_variable``, or None when the variable is unset or empty."""
    return int_variable(environ, name, minimum) if environ.get(name, "") != "" else None


def seconds_variable(environ: Mapping[str, str], name: str) -> float | None:
    """A duration in seconds (> 0) from ``environ[name]``, or None when unset or empty."""
    raw = environ.get(name, "")
    if raw == "":
        return None
    try:
        parse_float(raw, name=name)
    except ValueError:
        raise LaunchEnvironmentError(f"{name}={raw!r} is not a number of seconds") from None
    try:
        return parse_float(raw, name=name, above=0)
    except ValueError:
        raise LaunchEnvironmentError(f"{name}={raw!r} must be > 0") from None
