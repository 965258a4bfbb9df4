"""Failure drills: ``accel launch`` jobs that raise, die, hang, get signalled or restart.

Each drill prints ``DRILL <name>: <seconds>`` (run with ``-s`` to see the figures); timing is
never asserted. Every drill checks that no worker or DataLoader worker process survives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
LIMIT = 150.0  # seconds before a drill is declared hung (generous: 2 shared cores)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the drills read /proc and use Linux signals")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without launcher/ACCEL variables and without a user config."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCEL_", "TORCHELASTIC_", "PET_", "OMPI_", "PMI_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                         "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    env.update(extra)
    return env


class Job:
    """``accel launch`` in a subprocess; stdout/stderr lines collected by threads."""

    def __init__(self, args: list[str], tmp_path: Path, prefix: tuple[str, ...] = (),
                 **env: str) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "accel", "launch", "-q",
                                      *args],
                                     cwd=tmp_path, env=clean_env(tmp_path, **env), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self.out),
                                               (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, lines: list[tuple[float, str]]) -> None:
        for line in stream:
            lines.append((time.monotonic(), line))

    def wait_for(self, prefix: str, count: int = 1) -> float:
        """Wait until ``count`` stdout lines start with ``prefix``; returns the time."""
        while time.monotonic() - self.started < LIMIT:
            hits = [t for t, line in self.out if line.startswith(prefix)]
            if len(hits) >= count:
                return hits[count - 1]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        pytest.fail(f"no {count} x {prefix!r} lines:\n{self.text('out')}\n{self.text('err')}")

    def finish(self) -> tuple[int, float]:
        """Wait for the launcher; returns (exit code, time it exited)."""
        try:
            code = self.proc.wait(timeout=max(1.0, LIMIT - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"accel launch did not finish:\n{self.text('out')}\n{self.text('err')}")
        ended = time.monotonic()
        for reader in self._readers:
            reader.join(timeout=10)
        return code, ended

    def text(self, which: str) -> str:
        return "".join(line for _, line in (self.out if which == "out" else self.err))

    def first(self, which: str, needle: str) -> float:
        return next(t for t, line in (self.out if which == "out" else self.err) if needle in line)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def with_marker(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (the drill's unique pid dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.glob("*.pid")]


def wait_gone(pids: list[int], marker: str, limit: float = 30.0) -> float:
    """Seconds until every pid (and every process mentioning ``marker``) is gone."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if not any(alive(p) for p in pids) and not with_marker(marker):
            return time.monotonic() - start
        time.sleep(0.05)
    left = [p for p in pids if alive(p)] + with_marker(marker)
    for pid in left:  # do not leak them into the rest of the test session
        os.kill(pid, signal.SIGKILL)
    pytest.fail(f"processes outlived the job by {limit:.0f} s: {left}")


def drill(name: str, seconds: float) -> None:
    print(f"\nDRILL {name}: {seconds:.1f} s", flush=True)


def pid_dir(tmp_path: Path) -> Path:
    path = tmp_path / f"pids-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    return path


def start_rank_drill(mode: str, tmp_path: Path, **env: str) -> tuple[Job, Path]:
    pids = pid_dir(tmp_path)
    return Job(["--cpu", "-n", "2", str(SCRIPTS / "fail_rank.py"), mode, str(pids)], tmp_path,
               **env), pids


# ----------------------------------------------------------------------------- the drills
@pytest.mark.slow
def test_a_rank_raises_and_a_rank_is_sigkilled(tmp_path: Path) -> None:
    jobs = {mode: start_rank_drill(mode, tmp_path) for mode in ("raise", "sigkill")}
    for mode, (job, pids) in jobs.items():
        ready = job.wait_for("READY", 2)
        code, ended = job.finish()
        err = job.text("err")
        assert code != 0, err
        assert err.count("ROOT CAUSE") == 1, err
        block = err.split("ROOT CAUSE", 1)[1]
        assert block.startswith(": rank 1 (local rank 1) on host ") and " pid " in block, err
        if mode == "raise":
            assert 'fail_rank.py", line' in block and "in explode" in block, err
            assert "ValueError: boom from rank 1" in block, err
            assert err.count("Traceback (most recent call last)") == 1, err
        else:
            assert "SIGKILL" in block.splitlines()[0] and "killed by SIGKILL" in block, err
        assert "rank 0" in err.split("stopped as a consequence", 1)[1], err
        assert len(recorded_pids(pids)) == 6  # 2 ranks + 2 DataLoader workers each
        gone = wait_gone(recorded_pids(pids), pids.name)
        drill(f"rank {mode} -> launcher exit", ended - ready)
        drill(f"rank {mode} -> every process gone", ended - ready + gone)


@pytest.mark.slow
def test_a_hanging_rank_gets_a_stall_report_then_the_timeout(tmp_path: Path) -> None:
    job, pids = start_rank_drill("hang", tmp_path, ACCEL_TIMEOUT="6", ACCEL_STALL_SECONDS="2")
    ready = job.wait_for("READY", 2)
    code, ended = job.finish()
    err = job.text("err")
    assert code != 0, err
    assert err.count("accel STALL REPORT") == 1, err
    report = err.split("accel STALL REPORT", 1)[1].split("=" * 72)[0]
    assert report.startswith(": rank 0 has waited "), report
    lines = {line.split()[1]: line for line in report.splitlines() if line.startswith("  rank ")}
    assert "waiting in #" in lines["0"] and "barrier at " in lines["0"], report
    assert "fail_rank.py:" in lines["0"], report
    assert "not in a collective since #" in lines["1"], report
    assert "not there: rank 1 of 2" in report, report
    assert "collective timeout (6 s)" in report
    assert job.first("err", "accel STALL REPORT") < job.first("err", "ROOT CAUSE")
    wait_gone(recorded_pids(pids), pids.name)
    drill("rank hangs -> stall report", job.first("err", "accel STALL REPORT") - ready)
    drill("rank hangs -> launcher exit (timeout 6 s)", ended - ready)


def _site(out: str, rank: int) -> int:
    return int(next(line.split()[2] for line in out.splitlines()
                    if line.startswith(f"SITE {rank} ")))


@pytest.mark.slow
def test_collective_under_is_main_process_names_both_call_sites(tmp_path: Path) -> None:
    job = Job(["--cpu", "-n", "2", str(SCRIPTS / "fail_stall.py")], tmp_path,
              ACCEL_TIMEOUT="6", ACCEL_STALL_SECONDS="2")
    ready = job.wait_for("SITE", 2)
    code, ended = job.finish()
    err, out = job.text("err"), job.text("out")
    assert code != 0, err
    assert err.count("accel STALL REPORT") == 1, err
    report = err.split("accel STALL REPORT", 1)[1].split("=" * 72)[0]
    lines = {line.split()[1]: line for line in report.splitlines() if line.startswith("  rank ")}
    assert f"barrier at {SCRIPTS / 'fail_stall.py'}:{_site(out, 0)}" in lines["0"], report
    assert f"gather at {SCRIPTS / 'fail_stall.py'}:{_site(out, 1)}" in lines["1"], report
    assert "MISMATCH at #2, ranks are in 2 different collectives" in report, report
    assert "ROOT CAUSE" in err.split("accel STALL REPORT", 1)[1]
    drill("collective under is_main_process -> stall report",
          job.first("err", "accel STALL REPORT") - ready)
    drill("collective under is_main_process -> launcher exit (timeout 6 s)", ended - ready)


@pytest.mark.slow
def test_debug_mode_names_each_ranks_shape(tmp_path: Path) -> None:
    job = Job(["--cpu", "-n", "2", "--debug", str(SCRIPTS / "fail_mismatch.py")], tmp_path)
    code, _ = job.finish()
    err = job.text("err")
    assert code != 0 and "UNREACHABLE" not in job.text("out"), err
    block = err.split("ROOT CAUSE", 1)[1]
    assert "CollectiveMismatchError: ranks called collectives that do not match" in block, err
    assert "rank 0: reduce:sum((2,) float32)" in block, err
    assert "rank 1: reduce:sum((3,) float32)" in block, err
    assert 'fail_mismatch.py", line' in block, err


@pytest.mark.slow
def test_launcher_sigterm_runs_the_handler_once_on_every_rank(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    job = Job(["--cpu", "-n", "2", str(SCRIPTS / "fail_signal.py"), str(project)], tmp_path)
    job.wait_for("READY", 2)
    pids = [int(line.split()[2]) for line in job.text("out").splitlines()
            if line.startswith("READY")]
    time.sleep(0.5)  # a few steps
    sent = time.monotonic()
    job.proc.send_signal(signal.SIGTERM)
    code, ended = job.finish()
    err = job.text("err")
    assert code == 128 + signal.SIGTERM, err
    rows = [line.split() for line in (project / "handled.txt").read_text().splitlines()]
    assert sorted(row[0] for row in rows) == ["0", "1"], rows  # once per rank
    assert len({row[1] for row in rows}) == 1, rows  # at the same step on every rank
    assert {row[2] for row in rows} == {str(int(signal.SIGTERM))}
    assert {row[3] for row in rows} == {"checkpoint_0"}
    assert (project / "checkpoints" / "checkpoint_0" / "manifest.json").is_file()
    assert err.count("running the on_signal handler at sync point") == 2, err
    gone = wait_gone(pids, str(project))
    drill("launcher SIGTERM -> handler ran and launcher exited", ended - sent)
    drill("launcher SIGTERM -> every process gone", ended - sent + gone)


@pytest.mark.slow
def test_launcher_sigkill_leaves_no_orphans(tmp_path: Path) -> None:
    job, pids = start_rank_drill("idle", tmp_path)
    job.wait_for("READY", 2)
    recorded = recorded_pids(pids)
    assert len(recorded) == 6 and all(alive(p) for p in recorded)
    job.proc.kill()
    job.finish()
    gone = wait_gone(recorded, pids.name)
    drill("launcher SIGKILL -> every worker and DataLoader worker gone", gone)


def _result(job: Job) -> dict[str, Any]:
    rows = [json.loads(line[len("RESULT "):]) for line in job.text("out").splitlines()
            if line.startswith("RESULT ")]
    assert len(rows) == 1, job.text("out") + job.text("err")
    return rows[0]


@pytest.mark.slow
def test_restart_after_a_crash_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    script = str(SCRIPTS / "fail_restart.py")
    plain = Job(["--cpu", "-n", "2", script, str(tmp_path / "plain"), "-1"], tmp_path)
    crashed = Job(["--cpu", "-n", "2", "--max_restarts", "1", script, str(tmp_path / "crash"),
                   "10"], tmp_path)
    assert plain.finish()[0] == 0, plain.text("err")
    code, ended = crashed.finish()
    err = crashed.text("err")
    assert code == 0, err
    assert "RuntimeError: injected crash at step 10" in err
    expected, resumed = _result(plain), _result(crashed)
    assert (expected["attempt"], resumed["attempt"]) == (0, 1)
    # checkpoints at steps 4 and 8 (total_limit=2): the crash at 10 resumes from step 8
    assert resumed["resumed"] == "checkpoint_1", resumed
    assert resumed["steps"] == expected["steps"] == 18
    assert resumed["params"] == expected["params"]  # bit for bit
    drill("crash + restart + resume to the end", ended - crashed.started)
