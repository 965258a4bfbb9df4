"""Read Accelerate's pickled files with ``torch.load(weights_only=True)`` only; never unpickle.

``torch.load(weights_only=True)`` uses PyTorch's restricted unpickler: it builds tensors,
containers and numbers, and refuses every other global (class or function) a file names, so
loading cannot run code. Before loading, the globals a ``torch.save`` file names are listed
without executing anything (``torch.serialization.get_unsafe_globals_in_checkpoint``), so that a
file needing a full unpickler is reported by what it needs and is never handed to a loader.

The one allowlist added, for the duration of each load only, is numpy's array and scalar
reconstruction, because Accelerate's ``random_states_<rank>.pkl`` holds numpy's RNG state (a
``uint32`` array) and registered objects often hold numpy values. Accelerate allows the same
globals for its own loads. They are safe in the restricted unpickler:

- ``numpy.ndarray`` / ``_reconstruct(ndarray, shape, dtype)`` allocate an array whose bytes
  come from the file; the only class ``_reconstruct`` can build is one the unpickler allows
  (``ndarray``); object arrays are refused (their dtype class is not allowed; under an older
  numpy their items are still built by the restricted unpickler, and the checkpoint codec
  refuses object arrays);
- ``numpy.dtype`` and the numeric ``numpy.dtypes.*DType`` classes build dtypes from type codes;
- ``scalar(dtype, bytes)`` builds a numpy scalar from its raw bytes.

None of them imports, calls or looks up anything named by the file.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

__all__ = ["Unreadable", "forbidden_globals", "read_pickled"]


class Unreadable(Exception):
    """``torch.load(weights_only=True)`` cannot read a file; the message says why."""


def _numpy_globals() -> list[tuple[Callable[..., Any], str]]:
    # the functions themselves, from numpy.core or numpy._core, whichever this numpy has
    reconstruct = cast(Callable[..., Any], np.array(0).__reduce__()[0])
    scalar = cast(Callable[..., Any], np.float64(0).__reduce__()[0])
    found: list[tuple[Callable[..., Any], str]] = [(np.ndarray, "numpy.ndarray"),
                                                   (np.dtype, "numpy.dtype")]
    for package in ("numpy.core", "numpy._core"):  # files written under numpy 1.x or 2.x
        found += [(reconstruct, f"{package}.multiarray._reconstruct"),
                  (scalar, f"{package}.multiarray.scalar")]
    for code in "?bBhHiIlLqQefdgFDG":  # numeric and bool dtypes only (no object/str/void)
        cls = type(np.dtype(code))
        if cls is not np.dtype:  # numpy >= 1.25: one class per dtype, pickled by name
            found.append((cls, f"numpy.dtypes.{cls.__name__}"))
    return found


_NUMPY = _numpy_globals()
_ALLOWED = frozenset(name for _, name in _NUMPY)
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_CAUSE = re.compile(r"WeightsUnpickler error:\s*([^\n]+)")


def forbidden_globals(path: Path) -> list[str]:
    """The globals a ``torch.save`` file names that the restricted unpickler would refuse.

    Only the pickle's opcodes are read; nothing is constructed. Files that are not in
    ``torch.save``'s zip format return ``[]`` (the restricted load then decides).
    """
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError, pickle.UnpicklingError, EOFError):
        return []
    return sorted(set(names) - _ALLOWED)


def _needs_unpickler(names: list[str]) -> str:
    return (f"needs a full unpickler: it names {', '.join(sorted(set(names)))}, which "
            "torch.load(weights_only=True) refuses to build (loading it could run arbitrary "
            "code), so it was not loaded. If you trust it, re-save that state in a trusted "
            "environment as tensors, numbers, strings and containers of them")


def read_pickled(path: Path) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``, numpy arrays allowed.

    Raises:
        Unreadable: the file names a global the restricted unpickler refuses (listed), or is
            not a readable ``torch.save`` file.
    """
    bad = forbidden_globals(path)
    if bad:
        raise Unreadable(_needs_unpickler(bad))
    try:
        with torch.serialization.safe_globals(list(_NUMPY)), warnings.catch_warnings():
            # the file's pickle protocol is reported as a failure below if it matters
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        names = _GLOBAL.findall(text)
        if names:
            raise Unreadable(_needs_unpickler(names)) from None
        cause = _CAUSE.search(text)
        raise Unreadable("torch.load(weights_only=True) cannot read it"
                         + (f" ({cause.group(1).strip()})" if cause else "")
                         + "; it was not loaded") from None
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, TypeError,
            AttributeError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no details"
        raise Unreadable(f"not a readable torch.save file ({type(exc).__name__}: {first}); it "
                         "was not loaded") from None
