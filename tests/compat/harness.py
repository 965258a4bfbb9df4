"""Run Hugging Face Accelerate's own distributed test scripts against accel (or Accelerate).

The scripts ship in the ``accelerate`` wheel (``accelerate/test_utils/scripts``). For accel, only
their import lines change: ``accelerate`` becomes ``accel``, and the fixtures they take from
``accelerate.test_utils`` come from :mod:`tests.compat.fixtures`. Nothing else in a script is
edited.

To count test functions, every call in ``main()`` of a function the script defines whose name
reads as a test (``test_*``, ``check_*``, ``*_check``) is wrapped, by rewriting the syntax tree,
in a recorder that times it, catches its exception and writes one JSON line per process. A call
inside a loop counts once per iteration (``#1``, ``#2``, ... in its label). A test function
passes when it returned on every process.

Run by hand to compare the two libraries side by side::

    python -m tests.compat.harness --library accel
    python -m tests.compat.harness --library accelerate
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.spawn import clean_env, free_port

__all__ = ["SCRIPTS", "Outcome", "ScriptRun", "instrument", "run_script", "swap_imports"]

#: The scripts the issue names, relative to ``accelerate/test_utils/scripts``.
SCRIPTS = ("test_script.py", "test_sync.py", "test_ops.py", "test_distributed_data_loop.py",
           "external_deps/test_metrics.py", "test_ddp_comm_hook.py")

_TEST_NAME = re.compile(r"^(test_\w+|check_\w+|\w+_check)$")
_RECORDER = "__accel_compat_record__"

_PRELUDE = '''
import json as _cj, os as _co, time as _ct, traceback as _ctb
_compat_seen = {}
_compat_calls = [0]
def __accel_compat_record__(label, thunk):
    n = _compat_seen[label] = _compat_seen.get(label, 0) + 1
    rank = _co.environ.get("RANK", "0")
    _compat_calls[0] += 1
    only = _co.environ.get("ACCEL_COMPAT_ONLY")
    if only and int(only) != _compat_calls[0]:
        with open(_co.path.join(_co.environ["ACCEL_COMPAT_OUT"], f"rank{rank}.calls"), "a") as out:
            out.write(f"{label}#{n}\\n")
        return
    start = _ct.perf_counter()
    try:
        thunk()
        error = None
    except KeyboardInterrupt:
        raise
    except BaseException:  # also pytest's Failed and SystemExit: a failed test function
        error = _ctb.format_exc(limit=-3)
    seconds = _ct.perf_counter() - start
    record = {"label": f"{label}#{n}", "rank": int(rank), "ok": error is None,
              "error": error, "seconds": round(seconds, 3)}
    path = _co.path.join(_co.environ["ACCEL_COMPAT_OUT"], f"rank{rank}.jsonl")
    with open(path, "a") as out:
        out.write(_cj.dumps(record) + "\\n")
'''


def scripts_dir() -> Path:
    import accelerate  # the wheel only supplies the scripts; accel never imports it

    return Path(accelerate.__file__).parent / "test_utils" / "scripts"


def swap_imports(source: str) -> str:
    """The script as an accel user would run it: ``accelerate`` imports become ``accel``."""
    out = []
    for line in source.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if re.match(r"from accelerate\.test_utils(\.\w+)* import ", stripped):
            line = indent + re.sub(r"^from accelerate\.test_utils(\.\w+)*", "from tests.compat.fixtures",
                                   stripped)
        elif stripped.startswith("from accelerate.") or stripped.startswith("from accelerate "):
            line = indent + "from accel" + stripped[len("from accelerate"):]
        elif stripped.startswith("import accelerate"):
            line = indent + "import accel as accelerate" + stripped[len("import accelerate"):]
        out.append(line)
    return "\n".join(out) + "\n"


class _Wrap(ast.NodeTransformer):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        call = node.value
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id in self.names):
            label = ast.unparse(call)
            thunk = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                  kw_defaults=[], defaults=[]), body=call)
            wrapped = ast.Call(func=ast.Name(_RECORDER, ast.Load()),
                               args=[ast.Constant(label), thunk], keywords=[])
            return ast.copy_location(ast.Expr(wrapped), node)
        return node


def instrument(source: str) -> str:
    """Wrap every test-function call in ``main()`` in the recorder (see the module docstring)."""
    tree = ast.parse(source)
    names = {node.name for node in tree.body
             if isinstance(node, ast.FunctionDef) and _TEST_NAME.match(node.name)}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            _Wrap(names).visit(node)
    prelude = ast.parse(_PRELUDE).body
    # After any `from __future__` import, which must stay first.
    at = next((i for i, n in enumerate(tree.body)
               if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")), 0)
    tree.body[at:at] = prelude
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


@dataclass
class Outcome:
    label: str
    ok: bool
    errors: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class ScriptRun:
    script: str
    returncode: int
    outcomes: list[Outcome]
    output: str
    seconds: float

    @property
    def passed(self) -> list[str]:
        return [o.label for o in self.outcomes if o.ok]

    @property
    def failed(self) -> list[str]:
        return [o.label for o in self.outcomes if not o.ok]


def _outcomes(out_dir: Path, nprocs: int) -> list[Outcome]:
    by_label: dict[str, Outcome] = {}
    seen: dict[str, set[int]] = {}
    for rank in range(nprocs):
        path = out_dir / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            rec = json.loads(line)
            outcome = by_label.setdefault(rec["label"], Outcome(rec["label"], True))
            seen.setdefault(rec["label"], set()).add(rank)
            outcome.seconds = max(outcome.seconds, rec["seconds"])
            if not rec["ok"]:
                outcome.ok = False
                outcome.errors[rank] = rec["error"]
    for label, ranks in seen.items():
        if len(ranks) != nprocs:  # a process died or never got there: not a pass
            by_label[label].ok = False
            by_label[label].errors.setdefault(-1, f"recorded on ranks {sorted(ranks)} only")
    return list(by_label.values())


def _launch(target: Path, library: str, out_dir: Path, nprocs: int, timeout: float,
            **extra: str) -> tuple[int, str]:
    out_dir.mkdir(exist_ok=True)
    env = clean_env(target.parent, ACCEL_COMPAT_OUT=str(out_dir), OMP_NUM_THREADS="1",
                    CUDA_VISIBLE_DEVICES="", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
                    TRANSFORMERS_OFFLINE="1", **extra)
    if library == "accel":
        cmd = [sys.executable, "-m", "accel", "launch", "--num_processes", str(nprocs),
               "--main_process_port", str(free_port()), str(target)]
    else:  # Accelerate runs its CPU processes as MULTI_CPU only when told to use the CPU
        env["ACCELERATE_USE_CPU"] = "1"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs),
               "--master_port", str(free_port()), str(target)]
    # A session of its own, so that a job that hangs is ended whole: the launcher first (SIGTERM:
    # it stops its workers), then anything left in the session (DataLoader workers stuck before
    # their parent watchdog runs would otherwise outlive a SIGKILLed launcher).
    proc = subprocess.Popen(cmd, env=env, cwd=target.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, err = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                out, err = "", ""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the launcher left in the session
        return -1, f"timed out after {timeout} s\n{out}{err}"


def run_script(script: str, library: str, work: Path, nprocs: int = 2,
               timeout: float = 600.0, isolate: bool = False) -> ScriptRun:
    """Run one script in ``nprocs`` CPU processes with ``library`` ('accel' or 'accelerate').

    ``isolate`` runs each test function in a job of its own (first a job that runs none, to
    list them), so that one that hangs or kills its processes costs only itself; without it,
    one job runs them all in order, as the script's ``main()`` does.
    """
    source = (scripts_dir() / script).read_text()
    if library == "accel":
        source = swap_imports(source)
    name = Path(script).stem
    target = work / f"{library}_{name}.py"
    target.write_text(instrument(source))
    out_dir = work / f"{library}_{name}_out"
    start = time.perf_counter()
    if not isolate:
        code, output = _launch(target, library, out_dir, nprocs, timeout)
        if code == -1:
            # A rare hang (seen about once in ten runs on 2 busy cores: a DataLoader worker of
            # test_distributed_data_loop.py's shuffled loader never answers on one rank) is
            # shown on stderr, then the script runs once more; a second hang fails the test.
            tail = "\n".join(output.splitlines()[-40:])
            print(f"{script} ({library}) hung; run again. Its output ended:\n{tail}",
                  file=sys.stderr)
            shutil.rmtree(out_dir, ignore_errors=True)
            code, again = _launch(target, library, out_dir, nprocs, timeout)
            output = f"{output}\n--- hung, run again ---\n{again}"
        return ScriptRun(script, code, _outcomes(out_dir, nprocs), output,
                         time.perf_counter() - start)
    listing = work / f"{library}_{name}_list"
    code, output = _launch(target, library, listing, nprocs, timeout, ACCEL_COMPAT_ONLY="-1")
    listed = listing / "rank0.calls"
    calls = listed.read_text().splitlines() if listed.exists() else []
    outputs = [output]
    for index in range(1, len(calls) + 1):
        rc, out = _launch(target, library, out_dir, nprocs, timeout,
                          ACCEL_COMPAT_ONLY=str(index))
        code = code or rc
        outputs.append(out)
    return ScriptRun(script, code, _outcomes(out_dir, nprocs), "\n".join(outputs),
                     time.perf_counter() - start)


def run_all(library: str, scripts: Iterable[str] = SCRIPTS, isolate: bool = False,
            timeout: float = 600.0) -> list[ScriptRun]:
    with tempfile.TemporaryDirectory(prefix="accel-compat-") as tmp:
        return [run_script(s, library, Path(tmp), isolate=isolate, timeout=timeout)
                for s in scripts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", choices=["accel", "accelerate"], default="accel")
    parser.add_argument("--verbose", "-v", action="store_true")
    parser.add_argument("--isolate", action="store_true",
                        help="one job per test function (slow; survives hangs)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("scripts", nargs="*", default=list(SCRIPTS))
    args = parser.parse_args(argv)
    total = passed = 0
    for run in run_all(args.library, args.scripts, args.isolate, args.timeout):
        print(f"== {run.script}: {len(run.passed)}/{len(run.outcomes)} passed, "
              f"exit {run.returncode}, {run.seconds:.1f} s")
        for outcome in run.outcomes:
            print(f"   {'PASS' if outcome.ok else 'FAIL'} {outcome.label} ({outcome.seconds:.2f} s)")
            if not outcome.ok and args.verbose:
                for rank, err in outcome.errors.items():
                    print(f"      rank {rank}: {err.strip().splitlines()[-1] if err else ''}")
        if run.returncode != 0 and args.verbose:
            print("   output tail:\n" + "\n".join(run.output.splitlines()[-25:]))
        total += len(run.outcomes)
        passed += len(run.passed)
    print(f"TOTAL {args.library}: {passed}/{total} test functions passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
