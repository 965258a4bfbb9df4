"""What keeps one test from leaking into the next, and the cost tier each test runs in.

``tests/conftest.py`` wires these into autouse fixtures and a collection hook; they live here so
the tests in ``tests/unit/test_isolation.py`` can call them directly.

Tiers (pytest markers, applied from the test's folder by :func:`tier_of`):

* ``unit``: ``tests/unit``, one process, fast; no test may start a process
  (:func:`forbid_process_starts`).
* ``multiprocess``: ``tests/distributed`` (real processes over gloo via ``tests.spawn``) and
  ``tests/cuda`` (the same on GPUs, also marked ``cuda``).
* ``e2e``: ``tests/e2e`` (``accel launch`` subprocesses, notebooks, drills), ``tests/compat``
  (Accelerate's own scripts run under both libraries) and ``tests/xla`` (a PJRT runtime, driven by
  ``tests/xla/run.sh``, also marked ``xla``).
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest

__all__ = ["TIERS", "LeakedProcessGroupWarning", "forbid_process_starts", "restore_environ",
           "tear_down_process_group", "tier_of"]

#: First folder under ``tests/`` -> the tier marker its tests get.
TIERS: Mapping[str, str] = {"unit": "unit", "distributed": "multiprocess", "cuda": "multiprocess",
                            "e2e": "e2e", "compat": "e2e", "xla": "e2e"}

#: ``os`` functions that start a process without going through ``subprocess.Popen``.
_OS_STARTS = ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp")


class LeakedProcessGroupWarning(UserWarning):
    """A test ended with a torch.distributed default process group still initialised."""


def tier_of(path: Path, tests_root: Path) -> str | None:
    """The tier marker of the test file ``path`` (None outside a tier folder of ``tests_root``).

    Example:
        >>> tier_of(Path("/r/tests/unit/env/test_env.py"), Path("/r/tests"))
        'unit'
        >>> tier_of(Path("/r/tests/distributed/test_state.py"), Path("/r/tests"))
        'multiprocess'
        >>> tier_of(Path("/r/other/test_x.py"), Path("/r/tests")) is None
        True
    """
    try:
        parts = path.relative_to(tests_root).parts
    except ValueError:
        return None
    return TIERS.get(parts[0]) if len(parts) > 1 else None


def restore_environ(saved: Mapping[str, str]) -> None:
    """Put ``os.environ`` back to ``saved``: drop additions, undo changes and deletions."""
    for name in [name for name in os.environ if name not in saved]:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def tear_down_process_group(nodeid: str) -> bool:
    """Destroy the default process group a test left initialised, warning which test leaked it.

    Imports nothing: a test that never imported ``torch.distributed`` cannot have left a group.
    Returns whether there was one.
    """
    dist: Any = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    dist.destroy_process_group()
    warnings.warn(LeakedProcessGroupWarning(
        f"{nodeid} left a torch.distributed default process group initialised (tests/conftest.py "
        "destroyed it). Destroy it in the test itself: call "
        "torch.distributed.destroy_process_group() in a finally block or a fixture teardown."),
        stacklevel=1)
    return True


def _refuse(nodeid: str, what: str) -> Callable[..., NoReturn]:
    def refused(*args: object, **kwargs: object) -> NoReturn:
        pytest.fail(
            f"{nodeid} is a unit test but starts a process ({what}). Unit tests (tests/unit) run "
            "in one process. Move it to tests/distributed/<package>/ if it runs the library in "
            "several processes (tests.spawn.run_workers), or to tests/e2e/<package>/ if it runs "
            "python, accel launch or a script as a subprocess.")

    return refused


def forbid_process_starts(monkeypatch: pytest.MonkeyPatch, nodeid: str) -> None:
    """Make every way of starting a process fail the test ``nodeid`` with a message saying where
    to move it. ``pytest.fail`` raises a ``BaseException``, so ``except Exception`` around the
    start cannot swallow it."""
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse(nodeid, "subprocess.Popen"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        _refuse(nodeid, "multiprocessing Process.start"))
    for name in _OS_STARTS:
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(nodeid, f"os.{name}"))
