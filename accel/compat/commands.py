"""Accelerate's ``accelerate.commands.*`` module paths, over accel's own command line.

Scripts and tools build ``accelerate launch`` in-process (TRL's CLI does:
``launch_command(launch_command_parser().parse_args(argv))``); the same lines run
``accel launch`` here. ``accelerate test`` and ``accelerate env`` are ``accel test`` and
``accel env``. ``to-fsdp2``, ``tpu-config`` and ``estimate-memory`` are in
:mod:`accel.compat.commands_tools`, the config file classes in
:mod:`accel.compat.commands_config`, the launch helpers in :mod:`accel.compat.commands_launch`.
Accelerate's other commands (the ``config`` questionnaire, ``merge-weights``) are refused by
name with what to use instead (:mod:`accel.compat.refusals`): they import, and raise when used.
Their parsers are built (a tool may build them at import time) and take any arguments; running
the command raises.

Example:
    >>> from accel.commands.launch import launch_command_parser
    >>> args = launch_command_parser().parse_args(["--cpu", "-n", "2", "train.py", "--lr", "1"])
    >>> args.num_processes, args.script, args.script_args
    (2, 'train.py', ['--lr', '1'])
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from typing import Any

from .refusals import REFUSED_COMMANDS

__all__ = ["config_command_parser", "env_command", "env_command_parser", "launch_command",
           "launch_command_parser", "merge_command_parser", "refused_command_parser",
           "test_command", "test_command_parser"]



def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``accel launch`` parser (Accelerate's flags, both spellings), alone or as the
    ``launch`` sub-command of ``subparsers``."""
    # launch/ is the side layer: imported lazily (tests/unit/test_architecture.py, SIDE_USERS)
    from ..launch.cli import launch_parser

    return launch_parser(subparsers)


def launch_command(args: argparse.Namespace) -> None:
    """Run ``accel launch`` with ``args`` from :func:`launch_command_parser` (or spelled as
    Accelerate's parser spells them: ``cpu``, ``training_script``, ...).

    Raises:
        subprocess.CalledProcessError: the job failed (its exit status; the launcher printed the
            root cause).
        ValueError: a refused flag, a missing script or contradicting settings (the message
            says which).
    """
    from ..launch.cli import run_launch
    from .commands_launch import accel_namespace

    status = run_launch(accel_namespace(args))
    if status != 0:
        raise subprocess.CalledProcessError(status, ["accel", "launch", str(args.script)])


def _parser(name: str, text: str, subparsers: Any) -> argparse.ArgumentParser:
    if subparsers is not None:
        parser: argparse.ArgumentParser = subparsers.add_parser(name, help=text)
    else:
        parser = argparse.ArgumentParser(prog=f"accel {name}", description=text)
    parser.add_argument("--config_file", "--config-file", default=None,
                        help="ignored by accel's self-test (it always runs 2 CPU processes)")
    return parser


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``accel test`` parser (alone or as a sub-command of ``subparsers``)."""
    return _parser("test", "2-process CPU self-check of collectives and a DDP step", subparsers)


def test_command(args: argparse.Namespace) -> None:
    """Run ``accel test``: 2 CPU processes check collectives and a DDP step.

    Raises:
        RuntimeError: the self-test failed (what failed is printed above).
    """
    from ..launch.selftest import run_selftest

    if run_selftest() != 0:
        raise RuntimeError("accel test failed: see the lines above for the failing check")


def refused_command_parser(command: str, subparsers: Any = None) -> argparse.ArgumentParser:
    """A parser for Accelerate's ``command`` that accel does not run: it takes any arguments,
    and its description says what to use instead (running the command raises)."""
    reason = REFUSED_COMMANDS[command]
    name = command.replace("_", "-")
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=reason) \
        if subparsers is not None else argparse.ArgumentParser(prog=f"accelerate {name}",
                                                               description=reason)
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="not used by accel")
    parser.set_defaults(accel_refused=reason)
    return parser


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``accel env`` parser (alone or as a sub-command of ``subparsers``)."""
    return _parser("env", "what accel detects here (paste it into bug reports)", subparsers)


def env_command(args: argparse.Namespace) -> dict[str, str]:
    """Print ``accel env``'s report and return it as ``{item: value}``: accel's items, and
    those of Accelerate's report that carry over (``Platform``, ``Python version``,
    ``PyTorch version``, where the ``accel`` and ``accelerate`` commands are on PATH)."""
    from ..launch.info import env_report

    report = env_report()
    print(report)
    found: dict[str, str] = {}
    for line in report.splitlines():
        key, sep, value = line.removeprefix("- ").partition(": ")
        if sep and not line.startswith("  "):
            found[key] = value
    found.update({
        "Platform": found.get("platform", ""),
        "Python version": found.get("Python", "").split(" ")[0],
        "PyTorch version": found.get("torch", "").split(" ")[0],
        # Accelerate's command, if installed too (it is a different library)
        "`accelerate` bash location": shutil.which("accelerate") or "Not found",
        "`accel` bash location": shutil.which("accel") or "Not found",
    })
    return found


def _refused(command: str) -> Any:
    def parser(subparsers: Any = None) -> argparse.ArgumentParser:
        return refused_command_parser(command, subparsers)

    parser.__name__ = parser.__qualname__ = f"{command}_command_parser"
    parser.__doc__ = f"Accelerate's ``{command}`` parser; the command is refused: " \
                     f"{REFUSED_COMMANDS[command]}."
    return parser


merge_command_parser = _refused("merge")
config_command_parser = _refused("config")
