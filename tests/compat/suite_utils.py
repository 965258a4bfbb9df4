"""``accelerate.test_utils`` for the ported Accelerate suite (see :mod:`tests.compat.suite`).

The port maps every ``accelerate.test_utils[.*]`` import here. Accelerate's own helpers are
re-exported as they are (decorators that look at the machine, models, datasets, subprocess
runners: none of them reads Accelerate's state); the few that read or reset library state, build
a launch command or locate Accelerate's scripts answer for accel instead:

- ``AccelerateTestCase`` resets accel's ``AcceleratorState``/``GradientState`` after each test;
- ``get_launch_command`` / ``DEFAULT_LAUNCH_COMMAND`` start ``accel launch``;
- ``path_in_accelerate_package`` gives, for one of Accelerate's test scripts, a copy ported the
  same way (imports only), so a launched script runs on accel;
- ``are_the_same_tensors`` gathers with accel;
- the script modules ``test_script``, ``test_sync``, ``test_ops`` (and ``test_metrics``) are the
  ported copies, imported under their own names (their folder joins ``sys.path``, which spawned
  workers inherit), so that ``debug_launcher(test_sync.main)`` runs accel: re-exported as they
  are, they would run Accelerate itself.
"""

from __future__ import annotations

import importlib
import sys
import unittest
from pathlib import Path
from typing import Any

from accelerate.test_utils import *  # noqa: F403
from accelerate.test_utils.examples import *  # noqa: F403
from accelerate.test_utils.testing import *  # noqa: F403
from accelerate.test_utils.training import *  # noqa: F403

from tests.compat.fixtures import are_the_same_tensors  # noqa: F401
from tests.compat.suite import port_file

_ACCELERATE_DIR = Path(sys.modules["accelerate"].__file__ or "").parent
#: Accelerate's test scripts the suite imports as modules, and where each is
_SCRIPTS = {"test_script": ("test_utils", "scripts", "test_script.py"),
            "test_sync": ("test_utils", "scripts", "test_sync.py"),
            "test_ops": ("test_utils", "scripts", "test_ops.py"),
            "test_metrics": ("test_utils", "scripts", "external_deps", "test_metrics.py")}
for _name in _SCRIPTS:  # the star imports above bound Accelerate's own modules
    globals().pop(_name, None)


class AccelerateTestCase(unittest.TestCase):
    """Resets accel's shared state after every test, as Accelerate's does for its own."""

    def tearDown(self) -> None:
        super().tearDown()
        from accel.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


def get_launch_command(**kwargs: Any) -> list[str]:
    """``accel launch`` with ``--key=value`` flags (``--key`` for True), as Accelerate's."""
    command = [sys.executable, "-m", "accel", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool) and value:
            command.append(f"--{key}")
        elif value is not None:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)  # noqa: F405


def path_in_accelerate_package(*components: str) -> Path:
    """A path in the ``accelerate`` package; a ``.py`` file under ``test_utils`` comes back
    ported to accel (a copy with its imports swapped)."""
    path = _ACCELERATE_DIR.joinpath(*components)
    if path.suffix == ".py" and components[:1] == ("test_utils",):
        return port_file(path)
    return path


def __getattr__(name: str) -> Any:
    """One of Accelerate's test scripts (``_SCRIPTS``), ported to accel and imported."""
    if name not in _SCRIPTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    path = path_in_accelerate_package(*_SCRIPTS[name])
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    module = importlib.import_module(name)
    if Path(module.__file__ or "") != path:
        raise ImportError(f"{name} was imported from {module.__file__}, not the ported copy "
                          f"{path}: another module of that name is on sys.path")
    return module
