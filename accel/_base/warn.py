"""One way to warn about the user's code or configuration: at the user's own line.

``warnings.warn(..., stacklevel=N)`` needs ``N`` counted by hand for every call path, and it is
wrong as soon as a call path changes (a helper extracted, a context manager added). ``warn_user``
finds the line instead: the first frame, walking up from its caller, that is neither accel's
(a file of the package, or the ``__init__`` that ``@dataclass`` generates for one of its
classes) nor a pass-through (``contextlib``, ``functools``, torch's ``no_grad`` decorator,
``nn.Module.__call__``, the hooks torch wraps around ``optimizer.step``, ``python -m``, thread
start-up, the import machinery). When no frame is the user's (a warning from accel's own CLI or
from one of its threads), it points at the accel line that called ``warn_user``, which is then
the most useful place to read.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_user("gradient_accumulation_steps=1 is the default; drop it")
    >>> caught[0].category.__name__, str(caught[0].message)
    ('UserWarning', 'gradient_accumulation_steps=1 is the default; drop it')
    >>> caught[0].filename.startswith("<doctest")  # this example's line, not accel's
    True
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

__all__ = ["user_frame", "warn_user"]

# The package directory, found from this module's own depth in it (accel._base.warn: two
# levels below accel/), so that moving this module only means its name changes.
_DEPTH = __name__.count(".")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
for _ in range(_DEPTH - 1):
    _PACKAGE_DIR = os.path.dirname(_PACKAGE_DIR)
_PACKAGE_PREFIXES = tuple({os.path.join(_PACKAGE_DIR, ""),
                           os.path.join(os.path.realpath(_PACKAGE_DIR), "")})
_PACKAGE = __name__.split(".")[0]

#: Modules whose frames only pass a call through (decorators, context managers, hook dispatch,
#: ``python -m``, thread start-up): they are neither accel's nor the user's line.
_PASS_THROUGH = frozenset({"contextlib", "functools", "torch.utils._contextlib",
                           "torch.nn.modules.module", "torch.optim.optimizer",
                           "torch.optim.lr_scheduler", "runpy", "threading",
                           "concurrent.futures.thread"})


def _inside_accel(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    if filename == "<string>":  # code generated for an accel class: a dataclass's __init__
        name = str(frame.f_globals.get("__name__", ""))
        return name == _PACKAGE or name.startswith(_PACKAGE + ".")
    return filename.startswith(_PACKAGE_PREFIXES)


def _passes_through(frame: FrameType) -> bool:
    filename = frame.f_code.co_filename
    if "importlib" in filename and "_bootstrap" in filename:  # as warnings itself skips them
        return True
    return frame.f_globals.get("__name__") in _PASS_THROUGH


def user_frame(start: FrameType) -> FrameType:
    """The first frame from ``start`` upwards that is the user's (see the module docstring).

    ``start`` itself when no frame above it is outside accel and its wrappers.
    """
    frame: FrameType | None = start
    while frame is not None:
        if not _inside_accel(frame) and not _passes_through(frame):
            return frame
        frame = frame.f_back
    return start


def warn_user(message: str | Warning, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` reported at the user's line (see the module docstring).

    Filters, ``catch_warnings``, ``pytest.warns`` and the once-per-location registry behave as
    for ``warnings.warn``: the warning is issued with ``warnings.warn_explicit`` for the user's
    frame, with that frame's module and registry.
    """
    caller = sys._getframe(1)
    frame = user_frame(caller)
    module_globals = frame.f_globals
    registry = module_globals.setdefault("__warningregistry__", {})
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=module_globals.get("__name__", "<string>"),
                           registry=registry, module_globals=module_globals)
