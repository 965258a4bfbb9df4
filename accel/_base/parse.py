"""Validators shared by the command line, the config file, ``ACCEL_*`` variables and the API.

Pure functions on the standard library only (layer L0): each takes the raw value and the name
to show in the error, returns the parsed value, and raises ``ValueError`` saying what was found
and what was expected (plus a ``hint`` with the fix where the caller knows one). Callers that
need another error type (``CLIError``, ``LaunchEnvironmentError``, argparse's
``ArgumentTypeError``) catch ``ValueError`` and re-raise.

``name`` is the subject of the sentence ("num_processes must be ..."). Pass ``""`` where the
caller prefixes the name itself (argparse prints "argument -n/--num_processes: ...").

Example:
    >>> parse_int("4", name="num_processes", minimum=1)
    4
    >>> parse_int(0, name="gradient_accumulation_steps", minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: gradient_accumulation_steps must be an integer >= 1, got 0
    >>> parse_bool("on", name="debug"), parse_float("2.5", name="timeout", above=0)
    (True, 2.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = [
    "FALSE_WORDS",
    "TRUE_WORDS",
    "is_true",
    "parse_bool",
    "parse_choice",
    "parse_float",
    "parse_gpu_ids",
    "parse_int",
]

#: Spellings of true and false in flags, config files and environment variables.
TRUE_WORDS: tuple[str, ...] = ("1", "true", "yes", "on")
FALSE_WORDS: tuple[str, ...] = ("0", "false", "no", "off")


def _error(name: str, *, expected: str, value: object, hint: str) -> ValueError:
    subject = f"{name} must" if name else "must"
    tail = f"; {hint}" if hint else ""
    return ValueError(f"{subject} be {expected}, got {value!r}{tail}")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else format(value, "g")


def _bounds(minimum: float | None, maximum: float | None, above: float | None = None) -> str:
    """The bound part of "an integer >= 1" / "a port in [0, 65535]" / "a number > 0"."""
    if minimum is not None and maximum is not None and above is None:
        return f" in [{_number(minimum)}, {_number(maximum)}]"
    parts = [f"{sign} {_number(bound)}" for sign, bound in
             ((">=", minimum), (">", above), ("<=", maximum)) if bound is not None]
    return " " + " and ".join(parts) if parts else ""


def parse_int(value: object, *, name: str, minimum: int | None = None,
              maximum: int | None = None, strict: bool = False, what: str = "an integer",
              hint: str = "") -> int:
    """An ``int`` within ``[minimum, maximum]``, from an int or (unless ``strict``) its text.

    Booleans are refused (``True`` is not the integer 1 a user meant), and so are floats such
    as ``2.0``: an integer setting given a fraction is a mistake worth naming.

    Args:
        value: the raw value (``str`` from flags and the environment, ``int`` from YAML/API).
        name: what the value is, the subject of the error message.
        minimum: smallest allowed value (inclusive), or None.
        maximum: largest allowed value (inclusive), or None.
        strict: accept ``int`` only, not text (for Python API arguments).
        what: the noun in the message ("an integer", "a port", ...).
        hint: the fix, appended to the message.

    Raises:
        ValueError: "<name> must be an integer >= 1, got '-2'".

    Example:
        >>> parse_int(" 8 ", name="-n", minimum=1)
        8
    """
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and not strict:
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None or (minimum is not None and number < minimum) or (
            maximum is not None and number > maximum):
        raise _error(name, expected=what + _bounds(minimum, maximum), value=value, hint=hint)
    return number


def parse_float(value: object, *, name: str, minimum: float | None = None,
                above: float | None = None, maximum: float | None = None,
                strict: bool = False, what: str = "a number", hint: str = "") -> float:
    """A finite ``float`` (``>= minimum``, ``> above``, ``<= maximum``) from a number or its text.

    Booleans, NaN and infinities are refused.

    Raises:
        ValueError: "<name> must be a number of seconds > 0, got 'soon'".

    Example:
        >>> parse_float("90", name="timeout", above=0, what="a number of seconds")
        90.0
    """
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and not strict:
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number) or (
            minimum is not None and number < minimum) or (
            above is not None and number <= above) or (maximum is not None and number > maximum):
        raise _error(name, expected=what + _bounds(minimum, maximum, above), value=value, hint=hint)
    return number


def is_true(text: str) -> bool:
    """Lenient truth of a text flag: one of ``TRUE_WORDS`` (any case), else False.

    Example:
        >>> is_true("ON"), is_true("maybe")
        (True, False)
    """
    return text.strip().lower() in TRUE_WORDS


def parse_bool(value: object, *, name: str, empty: bool | None = None, strict: bool = False,
               hint: str = "") -> bool:
    """A ``bool`` from a bool or (unless ``strict``) one of ``TRUE_WORDS`` / ``FALSE_WORDS``.

    Args:
        value: the raw value.
        name: what the value is, the subject of the error message.
        empty: what an empty (or blank) string means; None makes it an error.
        strict: accept ``bool`` only (for Python API arguments).
        hint: the fix, appended to the message.

    Raises:
        ValueError: "<name> must be true or false (or 1/0, yes/no, on/off), got 'maybe'".

    Example:
        >>> parse_bool("No", name="debug"), parse_bool("", name="debug", empty=False)
        (False, False)
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and not strict:
        text = value.strip().lower()
        if text in TRUE_WORDS or text in FALSE_WORDS:
            return text in TRUE_WORDS
        if not text and empty is not None:
            return empty
    raise _error(name, expected="true or false (or 1/0, yes/no, on/off)", value=value, hint=hint)


def parse_choice(value: object, *, name: str, choices: Sequence[str],
                 aliases: Mapping[str, str] | None = None, what: str = "a valid choice",
                 hint: str = "") -> str:
    """One of ``choices`` (compared without case and surrounding blanks), after ``aliases``.

    Raises:
        ValueError: "<name>='fp8' is not <what>; expected one of no, fp16, bf16".

    Example:
        >>> parse_choice("GPU", name="device", choices=("cpu", "cuda"), aliases={"gpu": "cuda"})
        'cuda'
    """
    key = str(value).strip().lower()
    key = (aliases or {}).get(key, key)
    if key in choices:
        return key
    subject = f"{name}={value!r}" if name else repr(value)
    tail = f"; {hint}" if hint else ""
    raise ValueError(f"{subject} is not {what}; expected one of {', '.join(choices)}{tail}")


def parse_gpu_ids(value: object, name: str) -> str | None:
    """Comma-separated GPU indices, normalised (``" 0, 1"`` -> ``"0,1"``); ``all`` gives None.

    Raises:
        ValueError: not a list of non-negative integers.

    Example:
        >>> parse_gpu_ids(" 0, 2", "gpu_ids"), parse_gpu_ids("all", "gpu_ids")
        ('0,2', None)
    """
    if str(value).strip().lower() == "all":
        return None
    items = [item.strip() for item in str(value).split(",") if item.strip()]
    if not items or not all(item.isdigit() for item in items):
        raise _error(name, expected="comma-separated GPU indices such as 0,1 (or 'all')",
                     value=value, hint="")
    return ",".join(items)
