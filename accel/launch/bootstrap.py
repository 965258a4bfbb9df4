"""Run the user's script in a worker started by ``accel launch`` (torchrun's entrypoint).

``python -m accel.launch.bootstrap script.py [args]`` or ``... -m package.module [args]``
(or ``... --no-python executable [args]``, which execs the executable after the checks below):

- runs the target with ``runpy`` and ``__main__`` semantics: ``__name__ == "__main__"``,
  ``sys.argv == [script, *args]``, and the script's directory first on ``sys.path``, exactly as
  ``python script.py`` would (``-m`` keeps the working directory, as ``python -m`` does);
- arms ``PR_SET_PDEATHSIG`` so the worker dies if the launcher dies;
- writes ``sys.stdout``/``sys.stderr`` a whole line at a time (one ``write(2)`` per line, at each
  newline), so lines printed by different ranks on the shared terminal never interleave; text
  without a newline appears at the next newline or ``flush()``;
- with ``accel launch --log_dir DIR``, links its torchrun log files (teed by the launcher) as
  ``DIR/workerlog.<rank>`` (stdout) and ``DIR/workerlog.<rank>.err`` (stderr), Paddle's name,
  replaced on each restart so they always show the current attempt;
- on an uncaught exception (or ``sys.exit(non-zero)``) writes the traceback to torchelastic's
  error file (``TORCHELASTIC_ERROR_FILE``), so that the launcher prints one ROOT CAUSE block with
  rank, host, pid and traceback; the worker itself prints a single line.

Example (what ``accel launch`` runs in every worker)::

    python -u -m accel.launch.bootstrap train.py --lr 0.1
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

from ..env import agent_pid, error_file, formed_layout, rank_log_dir, requested_layout, worker_ranks
from .procs import set_parent_death_signal
from .report import user_traceback, write_error_file

__all__ = ["LaunchLayoutError", "check_layout", "exec_target", "link_rank_logs", "main",
           "run_target", "whole_lines"]

#: How long a failed worker may take to shut down before it exits hard (seconds).
_EXIT_GRACE = 10.0
#: Exit codes that mean "stopped by this signal" (128 + signal number), not a failure.
_SIGNAL_EXITS = {128 + int(signal.SIGTERM): "SIGTERM", 128 + int(signal.SIGINT): "SIGINT"}
_USAGE = ("usage: python -m accel.launch.bootstrap (script.py | -m module | --no-python "
          "executable) [args ...]")
_KINDS = {"-m": "module", "--no-python": "exec"}


def _split(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """(target, kind, args); kind is "script", "module" (``-m``) or "exec" (``--no-python``)."""
    if not argv or argv[0] in _KINDS and len(argv) < 2:
        raise SystemExit(f"accel.launch.bootstrap: {_USAGE}")
    if argv[0] in _KINDS:
        return argv[1], _KINDS[argv[0]], list(argv[2:])
    return argv[0], "script", list(argv[1:])


def exec_target(target: str, args: Sequence[str]) -> None:
    """Replace this process with the executable ``target`` (``accel launch --no_python``).

    The parent-death signal survives ``exec``; the error file does not (the executable's exit
    code is what the launcher reports).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(target, [target, *args])


def run_target(target: str, *, is_module: bool, args: Sequence[str]) -> None:
    """Run a script path or module as ``__main__`` with ``sys.argv = [target, *args]``."""
    sys.argv = [target, *args]
    if is_module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    # `python script.py` puts the script's directory first on sys.path, not the cwd.
    directory = os.path.dirname(os.path.realpath(target))
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = directory
    else:
        sys.path.insert(0, directory)
    # An absolute path gives the script an absolute __file__, as `python script.py` does.
    runpy.run_path(os.path.abspath(target), run_name="__main__")


def _record(exc: BaseException, code: int) -> None:
    rank, local_rank = worker_ranks()
    extra = {"rank": rank, "local_rank": local_rank}
    text = user_traceback(exc, internal=(__file__,))
    recorded = write_error_file(exc, path=error_file(), extra=extra, traceback_text=text)
    sys.stdout.flush()
    if recorded:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        print(f"[accel] rank {rank} failed: {type(exc).__name__}: {first} (full traceback in "
              "the launcher's report)", file=sys.stderr, flush=True)
    else:
        print(text, end="", file=sys.stderr, flush=True)
    # Exit even if shutdown hangs (non-daemon user threads, a wedged process-group destructor).
    timer = threading.Timer(_EXIT_GRACE, os._exit, args=(code,))
    timer.daemon = True
    timer.start()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1  # sys.exit("message") exits with 1, like Python itself


class LaunchLayoutError(RuntimeError):
    """The machines of one job were started with different process or machine counts."""


def check_layout(environ: Mapping[str, str] | None = None) -> None:
    """Compare torchrun's world with what ``accel launch`` on this machine was asked for.

    torchrun sums the processes that each machine brings, so machines started with different
    ``-n``/``--num_machines`` silently form a job of an unexpected size (or wait forever).
    ``environ`` defaults to this process's environment.
    """
    expected, actual = requested_layout(environ), formed_layout(environ)
    if expected is None or actual is None or expected == actual:
        return
    raise LaunchLayoutError(
        f"accel launch on this machine was started for {expected[0]} processes on "
        f"{expected[1]} machine(s), but the job that formed has WORLD_SIZE={actual[0]} on "
        f"{actual[1]} machine(s): the machines were started with different -n/--num_processes "
        "or --num_machines; pass the same values on every machine")


def link_rank_logs(environ: Mapping[str, str] | None = None) -> list[str]:
    """Link this worker's torchrun log files into ``accel launch --log_dir`` under per-rank names.

    torchrun keeps them at ``DIR/<run id>_<random>/attempt_<n>/<local rank>/std{out,err}.log``
    (next to the error file it names in ``TORCHELASTIC_ERROR_FILE``); the links are
    ``DIR/workerlog.<rank>`` and ``DIR/workerlog.<rank>.err``, relative, so DIR can be moved.
    Returns the links made (none outside ``accel launch --log_dir``).
    """
    directory, errors, rank = rank_log_dir(environ), error_file(environ), worker_ranks(environ)[0]
    if directory is None or errors is None or not rank.isdigit():
        return []
    made = []
    for stream, suffix in (("stdout.log", ""), ("stderr.log", ".err")):
        target = os.path.join(os.path.dirname(errors), stream)
        if not os.path.exists(target):  # that stream is not teed (--tee 1 or 2)
            continue
        link = os.path.join(directory, f"workerlog.{rank}{suffix}")
        temp = f"{link}.{os.getpid()}.tmp"
        try:
            os.symlink(os.path.relpath(target, directory), temp)
            os.replace(temp, link)  # atomic: a restart's link replaces the last attempt's
        except OSError as exc:
            print(f"[accel] rank {rank}: cannot link {link} -> {target}: {exc}; the log is at "
                  f"{target}", file=sys.stderr, flush=True)
            continue
        made.append(link)
    return made


def whole_lines(*streams: object) -> None:
    """Buffer each text stream up to its newlines (``python -u`` writes ``print``'s text and its
    newline with separate ``write(2)`` calls, which ranks sharing a pipe interleave)."""
    for stream in streams:
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a worker; returns the exit code."""
    whole_lines(sys.stdout, sys.stderr)
    target, kind, args = _split(sys.argv[1:] if argv is None else argv)
    set_parent_death_signal(agent_pid())
    link_rank_logs()
    try:
        check_layout()
        if kind == "exec":
            exec_target(target, args)
        run_target(target, is_module=kind == "module", args=args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code in _SIGNAL_EXITS:  # e.g. Accelerator.on_signal's handler ran, then exited
            print(f"[accel] rank {worker_ranks()[0]} stopped by "
                  f"{_SIGNAL_EXITS[code]} (exit code {code})", file=sys.stderr, flush=True)
        elif code != 0:
            _record(exc, code)
        return code
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then we exit 1
        _record(exc, 1)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
