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

from tests.procscan import alive, with_marker
from tests.spawn import clean_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
LIMIT = 150.0  # seconds before a drill is declared hung (generous: 2 shared cores)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the drills read /proc and use Linux signals")



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






def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in pid_dir.glob("*.pid")]


def wait_gone(pids: list[int], marker: str, limit: float = 30.0) -> float:
    """The time at which every pid (and every process mentioning ``marker``) is gone."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if not any(alive(p) for p in pids) and not with_marker(marker):
            return time.monotonic()
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
        drill(f"rank {mode} -> every process gone (DataLoader workers included)", gone - ready)


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
    drill("launcher SIGTERM -> every process gone", gone - sent)


@pytest.mark.slow
def test_launcher_sigkill_leaves_no_orphans(tmp_path: Path) -> None:
    job, pids = start_rank_drill("idle", tmp_path)
    job.wait_for("READY", 2)
    recorded = recorded_pids(pids)
    assert len(recorded) == 6 and all(alive(p) for p in recorded)
    ranks = [int(p.read_text()) for p in pids.glob("*-rank.pid")]
    killed = time.monotonic()
    job.proc.kill()
    ranks_gone = wait_gone(ranks, "/nonexistent marker/")
    gone = wait_gone(recorded, pids.name)
    job.finish()
    drill("launcher SIGKILL -> both workers gone (PR_SET_PDEATHSIG)", ranks_gone - killed)
    drill("launcher SIGKILL -> DataLoader workers gone too", gone - killed)


def _result(job: Job) -> dict[str, Any]:
    rows = [json.loads(line[len("RESULT "):]) for line in job.text("out").splitlines()
            if line.startswith("RESULT ")]
    assert len(rows) == 1, job.text("out") + job.text("err")
    return rows[0]


@pytest.mark.slow
@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_restart_after_a_crash_resumes_from_the_newest_checkpoint(tmp_path: Path,
                                                                   rdzv: str) -> None:
    # static is the multi-node default: its agent keeps one store across restarts, so the
    # retried workers must not read the dead attempt's keys (accel prefixes them per attempt)
    script = str(SCRIPTS / "fail_restart.py")
    plain = Job(["--cpu", "-n", "2", script, str(tmp_path / "plain"), "-1"], tmp_path)
    crashed = Job(["--cpu", "-n", "2", "--rdzv_backend", rdzv, "--max_restarts", "1", script,
                   str(tmp_path / "crash"), "10"], tmp_path)
    assert plain.finish()[0] == 0, plain.text("err")
    code, ended = crashed.finish()
    err = crashed.text("err")
    assert code == 0, err
    assert "RuntimeError: injected crash at step 10" in err
    # the failed attempt's root cause is printed before the restart (torchelastic drops it)
    before, _, after = err.partition("restarting all workers after the failure above, restart "
                                     "1 of 1")
    assert "ROOT CAUSE: rank 1" in before and 'fail_restart.py", line' in before, err
    assert "ROOT CAUSE" not in after, err  # the second attempt succeeded
    expected, resumed = _result(plain), _result(crashed)
    assert (expected["attempt"], resumed["attempt"]) == (0, 1)
    # checkpoints at steps 4 and 8 (total_limit=2): the crash at 10 resumes from step 8
    assert resumed["resumed"] == "checkpoint_1", resumed
    assert resumed["steps"] == expected["steps"] == 18
    assert resumed["params"] == expected["params"]  # bit for bit
    drill("crash + restart + resume to the end", ended - crashed.started)


# ----------------------------------------------------------------------------- bad input
PY_TAG = 'num_processes: !!python/object/apply:os.system ["touch {marker}"]\n'
BAD_CLI: list[tuple[str, list[str], dict[str, str], str]] = [
    # (name, argv after `accel`, files to create {name: text}, expected text in the one line)
    ("negative processes", ["launch", "--cpu", "-n", "-2", "ok.py"], {},
     "must be an integer >= 1, got '-2'"),
    ("zero processes", ["launch", "--cpu", "-n", "0", "ok.py"], {}, ">= 1, got '0'"),
    ("wrong type", ["launch", "--cpu", "-n", "two", "ok.py"], {}, "got 'two'"),
    ("unknown precision", ["launch", "--cpu", "--mixed_precision", "fp8", "ok.py"], {},
     "invalid choice: 'fp8'"),
    ("unknown flag", ["launch", "--cpu", "--no_such_flag", "ok.py"], {},
     "unrecognized arguments: --no_such_flag"),
    ("unknown command", ["lanch"], {}, "invalid choice: 'lanch'"),
    ("missing script", ["launch", "--cpu", "nope.py"], {}, "script 'nope.py' does not exist"),
    ("no script", ["launch", "--cpu"], {}, "no script given"),
    ("port out of range", ["launch", "--cpu", "--main_process_port", "70000", "ok.py"], {},
     "must be a port in [0, 65535]"),
    ("negative restarts", ["launch", "--cpu", "--max_restarts", "-1", "ok.py"], {},
     ">= 0, got '-1'"),
    ("machine rank too big", ["launch", "--cpu", "--num_machines", "2", "--machine_rank", "3",
                              "--main_process_ip", "10.0.0.1", "--main_process_port", "5",
                              "ok.py"], {}, "--machine_rank 3 must be < --num_machines 2"),
    ("multi-node without address", ["launch", "--cpu", "--num_machines", "2", "ok.py"], {},
     "needs --main_process_ip and --main_process_port"),
    ("missing config", ["launch", "--cpu", "--config_file", "/nonexistent/c.yaml", "ok.py"], {},
     "config file /nonexistent/c.yaml does not exist"),
    ("config is a directory", ["launch", "--cpu", "--config_file", "adir", "ok.py"], {},
     "is a directory"),
    ("malformed YAML", ["launch", "--cpu", "--config_file", "bad.yaml", "ok.py"],
     {"bad.yaml": "num_processes: [1,\n"}, "is not valid YAML"),
    ("YAML python tag", ["launch", "--cpu", "--config_file", "tag.yaml", "ok.py"],
     {"tag.yaml": PY_TAG}, "uses a YAML tag that is not allowed"),
    ("YAML wrong type", ["launch", "--cpu", "--config_file", "t.yaml", "ok.py"],
     {"t.yaml": "num_processes: many\n"}, "must be an integer >= 1, got 'many'"),
    ("YAML unknown precision", ["launch", "--cpu", "--config_file", "p.yaml", "ok.py"],
     {"p.yaml": "mixed_precision: fp8\n"}, "'fp8' is not a mixed precision mode"),
    ("YAML list", ["launch", "--cpu", "--config_file", "l.yaml", "ok.py"],
     {"l.yaml": "- 1\n- 2\n"}, "is a list; expected a mapping"),
    ("binary config", ["launch", "--cpu", "--config_file", "b.yaml", "ok.py"],
     {"b.yaml": "\udcff\udcfe"}, "is not UTF-8 text"),
    ("unwritable config path", ["config", "--config_file", "/proc/nonsense/c.yaml", "default"],
     {}, "cannot write config file /proc/nonsense/c.yaml"),
    ("bad join_timeout", ["launch", "--cpu", "-q", "--num_machines", "2", "--machine_rank", "1",
                          "--main_process_ip", "127.0.0.1", "--main_process_port", "5",
                          "--rdzv_conf", "join_timeout=abc", "ok.py"], {},
     "join_timeout='abc' must be a number of seconds > 0"),
]


@pytest.mark.parametrize("name, argv, files, expected", BAD_CLI, ids=[c[0] for c in BAD_CLI])
def test_bad_cli_input_is_one_line_and_exit_2(name: str, argv: list[str], files: dict[str, str],
                                              expected: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from accel.launch import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "ok.py").write_text("print('ran')\n")
    (tmp_path / "adir").mkdir()
    marker = tmp_path / "PWNED"
    for file, text in files.items():
        (tmp_path / file).write_bytes(text.format(marker=marker).encode("utf-8", "surrogateescape"))
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err, err
    assert "Traceback" not in err, err
    assert [line for line in err.splitlines() if "error:" in line] == \
        [line for line in err.splitlines() if expected in line], err  # one line says it all
    assert not marker.exists()  # the python tag never ran


@pytest.mark.slow
def test_bad_cli_input_through_the_real_command(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    (tmp_path / "tag.yaml").write_text(PY_TAG.format(marker=marker))
    (tmp_path / "ok.py").write_text("print('ran')\n")
    for argv, expected in ((["--no_such_flag", "ok.py"], "unrecognized arguments"),
                           (["--config_file", "tag.yaml", "ok.py"], "YAML tag"),
                           (["-n", "-1", "ok.py"], "must be an integer >= 1")):
        done = subprocess.run([sys.executable, "-m", "accel", "launch", "--cpu", *argv],
                              cwd=tmp_path, env=clean_env(tmp_path), capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 2 and expected in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "ran" not in done.stdout
    assert not marker.exists()


def _accelerator(**kwargs: Any) -> Any:
    from accel import Accelerator

    return Accelerator(**kwargs)


BAD_API: list[tuple[str, Any, type[BaseException], str]] = [
    ("unknown precision", lambda: _accelerator(cpu=True, mixed_precision="fp8"), ValueError,
     "unknown mixed_precision 'fp8'"),
    ("precision wrong type", lambda: _accelerator(cpu=True, mixed_precision=3), TypeError,
     "mixed_precision must be a string"),
    ("negative accumulation", lambda: _accelerator(cpu=True, gradient_accumulation_steps=-1),
     ValueError, "gradient_accumulation_steps must be an integer >= 1"),
    ("accumulation wrong type", lambda: _accelerator(cpu=True, gradient_accumulation_steps="2"),
     ValueError, "got '2'"),
    ("negative timeout", lambda: _accelerator(cpu=True, timeout=-5), ValueError,
     "timeout must be positive"),
    ("timeout wrong type", lambda: _accelerator(cpu=True, timeout="abc"), TypeError,
     "timeout must be seconds"),
    ("unknown device", lambda: _accelerator(device="tpu9"), ValueError,
     "'tpu9' is not a device kind"),
    ("unknown argument", lambda: _accelerator(cpu=True, foo=1), TypeError,
     "unsupported argument 'foo'"),
    ("prepare a model twice", lambda: _accelerator(cpu=True).prepare(*[_model()] * 2),
     ValueError, "prepare() got the same Linear twice; pass each object once"),
    ("unknown reduction", lambda: _accelerator(cpu=True).reduce(_ones(), "median"), ValueError,
     "unknown reduction 'median'"),
    ("save to a nonsense path", lambda: _accelerator(cpu=True).save_state("/proc/x/ckpt"),
     Exception, "/proc/x"),
    ("load a nonsense path", lambda: _accelerator(cpu=True).load_state("/nonexistent/ckpt"),
     Exception, "/nonexistent/ckpt"),
    ("on_signal not callable", lambda: _accelerator(cpu=True).on_signal(3), TypeError,
     "needs a callable handler"),
    ("notebook negative processes", lambda: _notebook(print, num_processes=-1), ValueError,
     "num_processes must be >= 1"),
    ("notebook processes wrong type", lambda: _notebook(print, num_processes="2"), TypeError,
     "num_processes must be an int"),
    ("notebook not a function", lambda: _notebook("f", num_processes=2), TypeError,
     "needs a function"),
]


def _ones() -> Any:
    import torch

    return torch.ones(2)


def _model() -> Any:
    import torch

    return torch.nn.Linear(2, 2)


def _notebook(*args: Any, **kwargs: Any) -> Any:
    from accel import notebook_launcher

    return notebook_launcher(*args, **kwargs)


@pytest.mark.parametrize("name, call, kind, expected", BAD_API, ids=[c[0] for c in BAD_API])
def test_bad_api_input_raises_a_clear_error_from_accel(name: str, call: Any,
                                                       kind: type[BaseException], expected: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import traceback

    for var in [v for v in os.environ if v.startswith(("ACCEL_", "TORCHELASTIC_"))] + \
            ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"]:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(kind) as info:
        call()
    assert expected in str(info.value)
    last = traceback.extract_tb(info.value.__traceback__)[-1].filename
    assert os.sep + "accel" + os.sep in last, f"raised from {last}, not from accel"
