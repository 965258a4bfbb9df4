"""Memory sizes: ``"10GB"``/``"10GiB"``/``"500MB"``/ints to bytes, bytes per dtype, and back.

Accepted spellings (case-insensitive units, optional space, decimals allowed):

- decimal units: ``B``, ``KB``, ``MB``, ``GB``, ``TB`` (powers of 1000): ``"10GB"`` is 10**10;
- binary units: ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of 1024): ``"10GiB"`` is 10 * 2**30;
- Accelerate's bit spellings: a lowercase ``b`` after the prefix (``"8Gb"``, ``"500mb"``) means
  bits, one eighth of the bytes, as ``accelerate.utils.convert_file_size_to_int`` reads them;
- an ``int`` (or a string of digits) is a number of bytes.

Example:
    >>> convert_file_size_to_int("10GB"), convert_file_size_to_int("1GiB")
    (10000000000, 1073741824)
    >>> convert_file_size_to_int("1.5 GB"), convert_file_size_to_int(512)
    (1500000000, 512)
    >>> format_size(3 * 2**30)
    '3.00 GiB'
"""

from __future__ import annotations

import math
import re

import torch

__all__ = ["convert_bytes", "convert_file_size_to_int", "dtype_byte_size", "format_size",
           "parse_dtype"]

_PREFIX = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
_PATTERN = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(([kKmMgGtT]?)(i?)([bB])?)\s*")
_ACCEPTED = ("bytes as an int, or a string such as '500MB', '1.5GB' or '10GiB' (units B, KB, "
             "MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024)")


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size`` (Accelerate's name): an int, or a string like ``"10GB"``/``"10GiB"``.

    Args:
        size: bytes as an ``int`` (>= 0), or a number with a unit: ``"500MB"``, ``"1.5GB"``,
            ``"10GiB"``, ``"2TB"``; ``"8Gb"`` (lowercase b) is 8 gigabits, as in Accelerate.

    Raises:
        ValueError: a negative number, an unknown unit or not a number; the message lists the
            accepted spellings. TypeError: neither an int nor a string.

    Example:
        >>> convert_file_size_to_int("500MB"), convert_file_size_to_int("2KiB")
        (500000000, 2048)
    """
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"a memory size must be {_ACCEPTED}; got {type(size).__name__} "
                        f"{size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"a memory size must be >= 0 bytes, got {size}; pass {_ACCEPTED}")
        return size
    match = _PATTERN.fullmatch(size)
    if match is None:
        raise ValueError(f"cannot read the memory size {size!r}; expected {_ACCEPTED}")
    number, unit, prefix, binary, byte = match.groups()
    if unit and not byte:  # "10G", "10Gi": say which unit was meant rather than guessing
        raise ValueError(f"memory size {size!r} has no byte unit; write e.g. "
                         f"'{number}{prefix.upper()}{binary}B'")
    if binary and not prefix:
        raise ValueError(f"cannot read the memory size {size!r}; expected {_ACCEPTED}")
    base = 1024 if binary else 1000
    value = float(number) * base ** _PREFIX[prefix.lower()]
    if byte == "b" and prefix:  # Accelerate: "Gb"/"Mb"/"Kb" are bits
        value /= 8
    return int(value)


def parse_dtype(dtype: str | torch.dtype, what: str = "dtype") -> torch.dtype:
    """A ``torch.dtype`` from a dtype or its name (``"float16"``, ``"torch.bfloat16"``, ``"bf16"``).

    Example:
        >>> parse_dtype("bf16"), parse_dtype("torch.float16")
        (torch.bfloat16, torch.float16)
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        name = dtype.strip().removeprefix("torch.")
        name = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                "half": "float16", "float": "float32"}.get(name, name)
        found = getattr(torch, name, None)
        if isinstance(found, torch.dtype):
            return found
    raise ValueError(f"{what}={dtype!r} is not a torch dtype; pass a torch.dtype or a name "
                     "such as 'float32', 'bfloat16', 'float16' (or 'fp32', 'bf16', 'fp16')")


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes per element of ``dtype`` (Accelerate's name; bool counts as one byte, as stored).

    Example:
        >>> dtype_byte_size(torch.float32), dtype_byte_size(torch.bfloat16)
        (4, 2)
    """
    return int(dtype.itemsize)


def format_size(num_bytes: float) -> str:
    """``num_bytes`` in binary units with two decimals (``"1.50 GiB"``), for tables.

    Example:
        >>> format_size(0), format_size(1536), format_size(5 * 2**20)
        ('0 B', '1.50 KiB', '5.00 MiB')
    """
    if num_bytes < 1024:
        return f"{int(num_bytes)} B"
    power = min(int(math.log(num_bytes, 1024)), 4)
    return f"{num_bytes / 1024 ** power:.2f} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[power]}"


def convert_bytes(size: float) -> str:
    """``size`` bytes in the largest unit under 1024 of it (steps of 1024, Accelerate's labels
    and rounding: two decimals at most).

    Example:
        >>> convert_bytes(512), convert_bytes(1536), convert_bytes(3 * 2**30)
        ('512 bytes', '1.5 KB', '3.0 GB')
    """
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"
