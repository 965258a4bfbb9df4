"""Horovod's own PyTorch tests, run against ``accel.horovod`` on 2 processes.

Source: ``test/test_torch.py`` of the horovod 0.20.2 source distribution on PyPI (the last
sdists that ship Horovod's tests), pinned by its sha256 and fetched once with pip into a cache
(``$ACCEL_COMPAT_CACHE``, default ``~/.cache/accel-compat``), as :mod:`tests.compat.suite` does
for Accelerate. None of Horovod's code is stored in this repository. ``--source PATH`` runs
another copy instead, e.g. ``test/parallel/test_torch.py`` of a Horovod checkout (a developer
run: CI has no network access to GitHub).

The port (:func:`port_source`) changes imports only:

- ``import horovod.torch as hvd`` -> ``import accel.horovod as hvd``;
- ``from horovod.torch.mpi_ops import X`` -> ``from accel.horovod import X``;
- ``from common import ...`` -> :mod:`tests.compat.horovod_suite_common`, a stand-in written for
  accel (Horovod's ``common.py`` is not in the sdist): ``mpi_env_rank_and_size``, ``temppath``
  and ``skip_or_fail_gpu_test``;
- ``from distutils.version import LooseVersion`` -> the stand-in's ``LooseVersion`` (on
  ``packaging``), only where this Python has no ``distutils`` (3.12+).

Other edits: ``inspect.getargspec(`` -> ``inspect.getfullargspec(`` where this Python no
longer has ``getargspec`` (removed in 3.11; the tests read only ``.args``, which both have).

Like ``horovodrun`` in gloo mode (how Horovod's CI runs these tests on CPU),
each worker has ``HOROVOD_RANK``/``HOROVOD_SIZE`` (and the local ones) in its environment: the
tests read them to know that re-initialising is allowed, and compare ``hvd.rank()`` with them.

The ported file runs under ``accel launch --cpu -np 2 -m tests.compat.horovod_suite --worker``:
each rank runs pytest on the same tests in the same order, writes junit xml
(``rank<r>.xml``) and, as each test starts and ends, a line of ``rank<r>.jsonl``. A test that
runs past ``--test-timeout`` seconds on a rank ends that rank (a watchdog thread, then
``faulthandler`` as a backstop) and with it the job; before each test the ranks wait for each
other (through files), so that a rank stuck in a test can not take the next test's collectives
for its own, and the other rank ends too. The harness records the test as ``hung``
(``crashed`` when a rank died in it), and starts the job again without it and without the tests
that already finished on every rank. A test passes only if it passed on both ranks.

Outcomes: ``passed``, ``skipped: <reason>``, ``failed: <first line>`` (the first failing rank's),
``hung: ...``, ``crashed: ...``. Usage::

    python -m tests.compat.horovod_suite [--source PATH] [--out f.json] [--write-known]
        [-k EXPR] [--test-timeout S]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.compat.suite import _CACHE, ROOT, fetch_sdist

__all__ = ["KNOWN", "KNOWN_GITHUB", "SHA256", "VERSION", "port_source", "run_suite", "source_file"]

VERSION = "0.20.2"
SHA256 = "80aad735969b914bf03b950729dde652704a587118ed5d1fcb0bb79c64b42f6c"
WORLD = 2
#: The tests of the sdist's file that do not pass under accel, each with its failure.
KNOWN = Path(__file__).with_name("horovod_suite_known.json")
#: The same for the newer file of Horovod's repository (``--source``; a developer run, measured
#: on ``test/parallel/test_torch.py`` of horovod/horovod 2626dc87a3a8eb8fb7d2216198ce45bce0f9e65a).
KNOWN_GITHUB = Path(__file__).with_name("horovod_suite_github_known.json")
#: Why a test may skip on a CPU machine with 2 processes (Horovod's own CI skips them too;
#: a bare "Skipped" is a test Horovod's file disables with ``@unittest.skip``).
CPU_SKIPS = re.compile(r"GPU|CUDA|NCCL|CCL|MPI|ROCm|XLA|[Mm]ac|not supported on CPU"
                       r"|^skipped: Skipped$")


def source_file() -> Path:
    """``test/test_torch.py`` of the pinned horovod sdist (with ``test_adasum_pytorch.py`` and
    ``LICENSE``), fetched and verified on first use (see :func:`tests.compat.suite.fetch_sdist`).
    """
    kept = ("test/test_torch.py", "test/test_adasum_pytorch.py", "LICENSE")
    return fetch_sdist("horovod", version=VERSION, sha256=SHA256, keep=kept.__contains__,
                       ready=kept[0]) / kept[0]


_SWAPS = (
    (re.compile(r"^(\s*)import horovod\.torch as (\w+)\s*$"), r"\1import accel.horovod as \2"),
    (re.compile(r"^(\s*)from horovod\.torch(?:\.\w+)* import "), r"\1from accel.horovod import "),
    (re.compile(r"^(\s*)from common import "),
     r"\1from tests.compat.horovod_suite_common import "),
)
_DISTUTILS = re.compile(r"^(\s*)from distutils\.version import LooseVersion\s*$")
_GETARGSPEC = re.compile(r"\binspect\.getargspec\(")


def port_source(source: str, *, distutils: bool | None = None,
                getargspec: bool | None = None) -> str:
    """``source`` with its Horovod imports swapped to accel (see the module docstring).

    ``distutils``/``getargspec``: whether this Python has them (default: look); without
    ``distutils`` the ``LooseVersion`` import goes to the stand-in, without
    ``inspect.getargspec`` its calls become ``inspect.getfullargspec``.

    Example:
        >>> print(port_source("import horovod.torch as hvd\\nfrom common import temppath\\n"
        ...                   "from distutils.version import LooseVersion",
        ...                   distutils=False), end="")
        import accel.horovod as hvd
        from tests.compat.horovod_suite_common import temppath
        from tests.compat.horovod_suite_common import LooseVersion
    """
    if distutils is None:
        distutils = importlib.util.find_spec("distutils") is not None
    if getargspec is None:
        getargspec = hasattr(inspect, "getargspec")
    out = []
    for line in source.splitlines():
        for pattern, replacement in _SWAPS:
            line = pattern.sub(replacement, line)
        if not distutils:
            line = _DISTUTILS.sub(r"\1from tests.compat.horovod_suite_common import LooseVersion",
                                  line)
        if not getargspec:
            line = _GETARGSPEC.sub("inspect.getfullargspec(", line)
        out.append(line)
    return "\n".join(out) + "\n"


# -- the worker: one rank's pytest ----------------------------------------------------------
class _Recorder:
    """A pytest plugin: one jsonl line as each test starts and for each of its reports, and
    a watchdog that ends the process when a test runs too long."""

    def __init__(self, log: Path, *, timeout: float, deselect: Sequence[str]) -> None:
        self.log, self.timeout, self.deselect = log, timeout, set(deselect)
        self.fences = log.parent / "fences"
        self.fences.mkdir(exist_ok=True)
        self.rank, self.started = int(os.environ["RANK"]), 0
        self.current: str | None = None
        self.deadline = float("inf")
        import threading

        threading.Thread(target=self._watch, daemon=True).start()

    def _write(self, **record: object) -> None:
        with self.log.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def _watch(self) -> None:
        import faulthandler

        while True:
            time.sleep(0.5)
            current = self.current
            if current is not None and time.monotonic() > self.deadline:
                self._write(test=current, event="hung", seconds=self.timeout)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        """Drop the deselected tests (by exact id: pytest's ``--deselect`` is a prefix)."""
        items[:] = [item for item in items if item.nodeid not in self.deselect]

    def pytest_collection_finish(self, session: Any) -> None:
        items = getattr(session, "items", [])
        self._write(event="collected", tests=[item.nodeid for item in items])

    def _fence(self) -> None:
        """Wait until every rank has finished the previous test (through files, not through
        torch): a rank still stuck in it would otherwise take the next test's collectives as
        its own. Ends this rank when that takes too long (the harness then blames the test
        the other rank is still in)."""
        self.started += 1
        mark = str(self.started)
        (self.fences / f"{mark}.{self.rank}").touch()
        deadline = time.monotonic() + self.timeout + 5
        while not all((self.fences / f"{mark}.{r}").exists() for r in range(WORLD)):
            if time.monotonic() > deadline:
                self._write(event="fence", mark=mark)
                os._exit(4)
            time.sleep(0.02)

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        import faulthandler

        self._fence()
        self._write(test=nodeid, event="start")
        self.current, self.deadline = nodeid, time.monotonic() + self.timeout
        faulthandler.dump_traceback_later(self.timeout + 15, exit=True)

    def pytest_runtest_logreport(self, report: Any) -> None:
        when, outcome = report.when, report.outcome
        message = ""
        longrepr = getattr(report, "longrepr", None)
        if outcome == "skipped" and isinstance(longrepr, tuple):
            message = str(longrepr[2]).removeprefix("Skipped: ")
        elif outcome == "failed":
            crash = getattr(longrepr, "reprcrash", None)
            message = getattr(crash, "message", None) or str(longrepr)
        self._write(test=report.nodeid, event=when, outcome=outcome,
                    message=message.strip().splitlines()[0][:200] if message.strip() else "")

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        import faulthandler

        faulthandler.cancel_dump_traceback_later()
        self._write(test=nodeid, event="end")
        self.current, self.deadline = None, float("inf")


def _worker(target: Path, outdir: Path, *, timeout: float, deselect: Sequence[str],
            keyword: str | None) -> int:
    """Run pytest on ``target`` in this rank (under ``accel launch``)."""
    import pytest

    rank, size = os.environ["RANK"], os.environ["WORLD_SIZE"]
    # what horovodrun sets in gloo mode (see the module docstring)
    os.environ.update(HOROVOD_RANK=rank, HOROVOD_SIZE=size,
                      HOROVOD_LOCAL_RANK=os.environ.get("LOCAL_RANK", rank),
                      HOROVOD_LOCAL_SIZE=os.environ.get("LOCAL_WORLD_SIZE", size),
                      HOROVOD_CROSS_RANK="0", HOROVOD_CROSS_SIZE="1")
    attempt = len(list(outdir.glob(f"rank{rank}.*.xml")))
    args = ["-q", "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(target.parent),
            f"--junitxml={outdir / f'rank{rank}.{attempt}.xml'}", str(target)]
    if keyword:
        args += ["-k", keyword]
    status = int(pytest.main(args, plugins=[_Recorder(outdir / f"rank{rank}.jsonl", timeout=timeout,
                                                   deselect=deselect)]))
    # failed tests are in the log: exit 0, or the launcher would stop the other rank mid-test
    return 0 if status in (0, 1, 5) else status


# -- the harness ----------------------------------------------------------------------------
def _read(log: Path) -> tuple[list[str], dict[str, list[dict[str, str]]], str | None]:
    """(collected tests, {test: its report records}, the test running when the rank ended)."""
    collected: list[str] = []
    reports: dict[str, list[dict[str, str]]] = {}
    current: str | None = None
    hung: set[str] = set()
    if not log.exists():
        return collected, reports, None
    for line in log.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        event = record["event"]
        if event == "collected":  # a new attempt
            collected, current = collected or record["tests"], None
        elif event == "start":  # a rerun (after another rank's hang) starts afresh
            current = record["test"]
            reports[current] = []
            hung.discard(current)
        elif event == "end":
            current = None
        elif event == "hung":
            hung.add(record["test"])
        elif event == "fence":
            pass
        else:
            reports.setdefault(record["test"], []).append(record)
    for test in hung:
        reports.setdefault(test, []).append({"event": "hung", "outcome": "hung"})
    return collected, reports, current


def _outcome(records: list[dict[str, str]]) -> str:
    """One rank's outcome of a test from its report records."""
    for record in records:
        if record["outcome"] == "hung":
            return "hung"
        if record["outcome"] == "failed":
            kind = "failed" if record["event"] == "call" else "error"
            return f"{kind}: {record['message']}"
    for record in records:
        if record["outcome"] == "skipped":
            return f"skipped: {record['message']}"
    return "passed"


def _combine(per_rank: list[str]) -> str:
    """A test's outcome over the ranks: the first rank's that is not a pass or skip."""
    for rank, outcome in enumerate(per_rank):
        if outcome.startswith(("failed", "error")):
            return f"{outcome} (rank {rank})" if len(set(per_rank)) > 1 else outcome
    if all(o == "passed" for o in per_rank):
        return "passed"
    if all(o.startswith("skipped") for o in per_rank):
        return per_rank[0]
    return f"failed: outcomes differ between ranks: {per_rank}"


def _launch(target: Path, outdir: Path, *, timeout: float, deselect: Sequence[str],
            keyword: str | None, budget: float) -> tuple[int | None, str]:
    """One ``accel launch`` of the workers; (exit status or None on timeout, output tail)."""
    (outdir / "deselect.json").write_text(json.dumps(list(deselect)))
    shutil.rmtree(outdir / "fences", ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "OMPI_", "PMI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(ACCEL_COMPAT_CACHE=str(_CACHE), XDG_CONFIG_HOME=str(outdir / "xdg"),
               PYTHONFAULTHANDLER="1")
    argv = [sys.executable, "-m", "accel", "launch", "--cpu", "-np", str(WORLD), "-q",
            "--num_cpu_threads_per_process", "1", "-m", "tests.compat.horovod_suite",
            "--worker", str(target), "--workdir", str(outdir), "--test-timeout", str(timeout)]
    if keyword:
        argv += ["-k", keyword]
    try:
        done = subprocess.run(argv, cwd=outdir, env=env, capture_output=True, text=True,
                              timeout=budget, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        return None, (out.decode(errors="replace") if isinstance(out, bytes) else out)[-4000:]
    return done.returncode, (done.stdout + done.stderr)[-20000:]


def run_suite(*, source: Path | None = None, keyword: str | None = None,
              test_timeout: float = 15, total_timeout: float = 900,
              keep: Path | None = None) -> dict[str, str]:
    """Every test of the (ported) file and its outcome under accel on 2 processes (``keep``:
    a directory to leave the ported file, logs and junit xml in)."""
    path = source if source is not None else source_file()
    start = time.monotonic()
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        outdir = keep if keep is not None else Path(tmp)
        outdir.mkdir(parents=True, exist_ok=True)
        for old in [*outdir.glob("rank*.jsonl"), *outdir.glob("rank*.xml"),
                    *outdir.glob("launch.log")]:
            old.unlink()
        target = outdir / "test_torch.py"
        target.write_text(port_source(path.read_text(encoding="utf-8")), encoding="utf-8")
        deselect: list[str] = []
        while True:
            budget = total_timeout - (time.monotonic() - start)
            if budget <= 0:
                break
            status, tail = _launch(target, outdir, timeout=test_timeout, deselect=deselect,
                                   keyword=keyword, budget=budget)
            with (outdir / "launch.log").open("a", encoding="utf-8") as fh:
                fh.write(f"== exit {status}, deselected {deselect}\n{tail}\n")
            culprit = _collect(outdir, results, status=status, tail=tail)
            if culprit is None or culprit in deselect:
                break
            deselect = sorted({*deselect, *results})
        for test in _collected(outdir):
            results.setdefault(test, "not run: the whole run timed out")
    return {_short(k): v for k, v in results.items()}


def _collected(outdir: Path) -> list[str]:
    return _read(outdir / "rank0.jsonl")[0] or _read(outdir / "rank1.jsonl")[0]


def _collect(outdir: Path, results: dict[str, str], *, status: int | None,
             tail: str) -> str | None:
    """Fold the ranks' logs into ``results`` (only tests finished on every rank); the test
    that hung or crashed a rank (recorded as such), or None when the run went through."""
    logs = [_read(outdir / f"rank{r}.jsonl") for r in range(WORLD)]
    order = {test: i for i, test in enumerate(_collected(outdir))}
    for test in order:
        if test in results:
            continue
        if all(test in reports and current != test for _, reports, current in logs):
            results[test] = _combine([_outcome(reports[test]) for _, reports, _ in logs])
    running = [(order.get(current, len(order)), rank, current)
               for rank, (_, _, current) in enumerate(logs) if current is not None]
    if not running and status is not None:
        if status != 0:
            raise RuntimeError(f"the workers exited {status} outside any test:\n{tail}")
        return None
    if not running:
        raise RuntimeError(f"the run timed out or ended outside any test:\n{tail}")
    _, rank, culprit = min(running)
    hung = any(r.get("outcome") == "hung" for r in logs[rank][1].get(culprit, []))
    results[culprit] = (f"hung: no result in time on rank {rank}" if hung
                        else f"crashed: rank {rank} did not finish it: it died, or hung while "
                        f"the other rank waited for it (exit {status})")
    return culprit


def _short(nodeid: str) -> str:
    """``test_torch.py::TorchTests::test_x`` whatever directory the file ran from."""
    return nodeid.rsplit("/", 1)[-1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, help="a test_torch.py to run instead of the "
                        "sdist's (e.g. test/parallel/test_torch.py of a Horovod checkout)")
    parser.add_argument("--out", type=Path, help="write every outcome to this JSON file")
    parser.add_argument("--write-known", action="store_true", help="record the tests that do "
                        "not pass (horovod_suite_known.json; with --source: the GitHub one)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--test-timeout", type=float, default=15.0,
                        help="seconds one test may take on a rank (default 15)")
    parser.add_argument("--workdir", type=Path, help="keep the ported file, the ranks' logs "
                        "(rank<r>.jsonl, with launch.log) and junit xml here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        deselect = json.loads((args.workdir / "deselect.json").read_text())
        return _worker(args.worker, args.workdir, timeout=args.test_timeout, deselect=deselect,
                       keyword=args.keyword)
    start = time.perf_counter()
    results = run_suite(source=args.source, keyword=args.keyword,
                        test_timeout=args.test_timeout, keep=args.workdir)
    counts = Counter(v.split(":")[0] for v in results.values())
    print(f"accel.horovod: {dict(counts)} in {time.perf_counter() - start:.0f} s")
    for test, outcome in sorted(results.items()):
        if outcome != "passed":
            print(f"  {test}: {outcome}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.write_known:
        path = KNOWN_GITHUB if args.source else KNOWN
        before = json.loads(path.read_text()) if path.exists() else {}
        # a departure keeps its written reason while the test still does not pass; an
        # unstable test stays listed (it may pass this time)
        kept = ("departure:", "unstable:")
        known = {k: before[k] if str(before.get(k, "")).startswith(kept) else v
                 for k, v in results.items()
                 if (v != "passed" or str(before.get(k, "")).startswith("unstable:"))
                 and not (v.startswith("skipped") and CPU_SKIPS.search(v))}
        path.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
