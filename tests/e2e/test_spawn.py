"""``accel.spawn`` (Paddle's ``paddle.distributed.spawn``) with real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spawn import clean_env

SCRIPT = Path(__file__).resolve().parent / "scripts" / "spawn_scenarios.py"
TIMEOUT = 240

pytestmark = pytest.mark.slow


def run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path,
                          env=clean_env(tmp_path), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
            if line.startswith("RESULT ")]
    return {row["name"]: row["value"] for row in rows}, done.stderr, elapsed


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_spawn_joins_returns_a_context_and_reraises_a_worker_failure(tmp_path: Path) -> None:
    got, err, _ = run(tmp_path, "main", str(tmp_path))
    # join=True (start_method spawn): the workers cooperate (all-reduce) and return values.
    first = got["join_true"]
    assert first["joined"] is True
    assert first["results"] == {
        "0": {"rank": 0, "world": 2, "total": 30.0, "device": "cpu"},
        "1": {"rank": 1, "world": 2, "total": 30.0, "device": "cpu"}}
    assert len(set(first["pids"])) == 2 and os.getpid() not in first["pids"]
    # join=False: join(timeout) says "still running", then join() waits; processes by rank.
    second = got["join_false"]
    assert second["early"] is False
    assert second["alive_while_running"] == [True, True]
    assert second["joined"] is True and second["alive_after"] == [False, False]
    assert second["ranks"] == [0, 1] and second["results"] == {"0": 0, "1": 1}
    assert sorted(os.listdir(tmp_path)) >= ["done0", "done1"]
    # A worker's exception is re-raised in the caller, naming the rank, with its traceback.
    raised = got["raised"]
    assert raised["type"] == "KeyError"
    assert any(note.startswith("raised in spawn worker rank 1 (pid ") for note in raised["notes"])
    assert "worker 1 says no" in raised["cause"] and "in fails" in raised["cause"]
    # nprocs=-1 without GPUs: one CPU process; gpus= is ignored with a warning.
    cpu = got["cpu_default"]
    assert list(cpu["results"]) == ["0"] and cpu["results"]["0"]["world"] == 1
    assert cpu["warnings"] == ["spawn(): gpus='0,1' is ignored: the processes run on the CPU "
                               "(no GPU visible, or backend='gloo')"]
    # Refused before any process starts, each saying what to do.
    lam, xpu, zero = got["refused"]
    assert lam.startswith("TypeError: spawn(): start_method='spawn' sends func to new "
                          "interpreters") and "pass start_method='fork'" in lam
    assert xpu.startswith("ValueError: spawn(): unsupported option(s) xpus (accel has no XPU")
    assert zero == "ValueError: spawn(): nprocs must be -1 (all devices) or >= 1, got 0"


@pytest.mark.parametrize("daemon", [True, False])
def test_spawn_daemon_decides_whether_exit_stops_or_waits_for_the_workers(
        tmp_path: Path, daemon: bool) -> None:
    got, err, elapsed = run(tmp_path, "daemon", str(tmp_path), "1" if daemon else "0")
    pids = got["pids"]
    assert len(pids) == 2, err
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids)
    finished = sorted(name for name in os.listdir(tmp_path) if name.startswith("done"))
    if daemon:  # the workers were stopped when the parent exited, before their 4 s sleep ended
        assert finished == []
    else:  # the parent waited for them, as for non-daemonic processes
        assert finished == ["done0", "done1"] and elapsed >= 4
