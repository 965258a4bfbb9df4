"""Pins: what accel's reliability probes read from the INSTALLED torch, Python and Linux.

The probes in ``accel/distributed/health/`` (and the in-order turn files of ``accel/env/log.py``)
read things that have no stable API: torchelastic's log records and frame locals, c10d store
behaviour missing from torch's stubs, CPython internals, ``/proc`` fields. Each test here reads
the same thing from what is installed (running the installed code in-process where it can, no
process is started), so that an upgrade fails HERE, naming the probe to update, instead of
silently degrading a user's job. A failure means:

- ``test_elastic_*``: torch changed torchelastic's agent (logger names, the restart record's text
  or arguments, the ``run_result`` local of ``SimpleElasticAgent._invoke_run``, or the fields of
  ``RunResult``/``ProcessFailure``); update ``accel/distributed/health/elastic.py`` (and
  ``extract_failures`` in ``accel/launch/core.py`` for ``ProcessFailure``).
- ``test_store_*``: torch changed a c10d ``Store`` method that ``stall.py`` and ``attendance.py``
  call (its arguments, its return type, or ``compare_set``'s answer, on which claims rely);
  update ``accel/distributed/health/stall.py`` / ``attendance.py``.
- ``test_stall_*``: Python or torch changed what ``stall.py`` reads (``threading._register_atexit``,
  frames, where torch's sources are); update ``accel/distributed/health/stall.py``.
- ``test_settle_*``: this kernel's ``/proc/<pid>/task/<tid>/stat`` is not laid out as
  ``settle.py`` parses it; update ``accel/distributed/health/settle.py``.
- ``test_turn_files_*``: ``/proc/self/stat``'s start time (field 22) is not where, or not in the
  units, ``accel/env/log.py`` reads it; update ``_process_start_time`` there. The turn files stay
  in L1 env/ (logging works without torch and before any process group; it cannot import L2).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.multiprocessing import api as workers_api
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from accel.distributed.health import elastic, stall
from accel.distributed.health.elastic import (
    AGENT_LOGGER,
    RESTART_TEXT,
    RESULT_LOCAL,
    WORKERS_LOGGER,
    Restart,
    quiet_agent_logs,
)
from accel.distributed.health.settle import busy_threads, thread_state
from accel.env.log import _process_start_time
from accel.launch.core import extract_failures

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="/proc is Linux's")


# ------------------------------------------------------------------ elastic.py: torchelastic


def test_elastic_logger_names_are_the_installed_modules_loggers() -> None:
    assert agent_api.logger.name == AGENT_LOGGER
    assert workers_api.logger.name == WORKERS_LOGGER


def test_elastic_restart_record_and_result_local_are_in_the_agent_loop() -> None:
    source = inspect.getsource(agent_api.SimpleElasticAgent._invoke_run)
    assert RESTART_TEXT in source, "the restart record's text changed"
    assert re.search(rf"\b{RESULT_LOCAL}\s*=\s*self\._monitor_workers\(", source), \
        f"_invoke_run no longer keeps the attempt's result in `{RESULT_LOCAL}`"
    assert "failures" in {f.name for f in dataclasses.fields(agent_api.RunResult)}
    # what accel.launch.core.extract_failures reads from each failure
    fields = {f.name for f in dataclasses.fields(ProcessFailure)}
    assert {"local_rank", "pid", "exitcode", "error_file_data"} <= fields


class _Agent(agent_api.SimpleElasticAgent):
    """torchelastic's real agent loop (``_invoke_run``) over scripted monitor results: nothing
    is started, every step that would touch a worker or a store does nothing."""

    def __init__(self, results: list[agent_api.RunResult], *, max_restarts: int,
                 nodes_waiting: int = 0) -> None:
        handler = _Rendezvous(nodes_waiting)
        spec = agent_api.WorkerSpec(role="trainer", local_world_size=2, rdzv_handler=handler,
                                    entrypoint="train.py", max_restarts=max_restarts,
                                    monitor_interval=0.001)
        super().__init__(spec, exit_barrier_timeout=1)
        self.results = results
        self.restarted = 0

    def _initialize_workers(self, worker_group: Any) -> None:
        worker_group.state = agent_api.WorkerState.HEALTHY

    def _restart_workers(self, worker_group: Any) -> None:
        self.restarted += 1

    def _monitor_workers(self, worker_group: Any) -> agent_api.RunResult:
        return self.results.pop(0)

    def _exit_barrier(self) -> None:
        pass

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        return {}

    def _stop_workers(self, worker_group: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Rendezvous:
    def __init__(self, waiting: int) -> None:
        self.waiting = waiting

    def num_nodes_waiting(self) -> int:
        waiting, self.waiting = self.waiting, 0
        return waiting


@pytest.fixture
def agent_logs() -> Iterator[list[logging.LogRecord]]:
    """The records the agent's logger hands its handlers; its state is restored afterwards."""
    loggers = [logging.getLogger(AGENT_LOGGER), logging.getLogger(WORKERS_LOGGER)]
    saved = [(lg.level, list(lg.filters), list(lg.handlers)) for lg in loggers]
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    loggers[0].addHandler(Keep())
    yield seen
    for lg, (level, filters, handlers) in zip(loggers, saved, strict=True):
        lg.setLevel(level)
        lg.filters[:] = filters
        lg.handlers[:] = handlers


def _failed(rank: int, exitcode: int) -> agent_api.RunResult:
    failure = ProcessFailure(local_rank=rank, pid=4000 + rank, exitcode=exitcode,
                             error_file="/nonexistent/error.json")
    return agent_api.RunResult(state=agent_api.WorkerState.FAILED, failures={rank: failure})


def test_elastic_installed_agent_restart_is_recognised_with_its_failures(
        agent_logs: list[logging.LogRecord]) -> None:
    attempts = [_failed(1, 3), _failed(0, 7)]
    results = [*attempts, agent_api.RunResult(state=agent_api.WorkerState.SUCCEEDED)]
    seen: list[Restart] = []
    quiet_agent_logs(seen.append, debug=False)
    agent = _Agent(results, max_restarts=2)
    agent._invoke_run()
    assert agent.restarted == 2
    assert [(r.state, r.left, r.total, r.number) for r in seen] == [
        ("FAILED", 2, 2, 1), ("FAILED", 1, 2, 2)]
    # the frame walk found each attempt's own failures, which the launcher can read
    assert [r.failures for r in seen] == [a.failures for a in attempts]
    assert all(r.failures is a.failures for r, a in zip(seen, attempts, strict=True))
    failure = extract_failures(seen[0].failures)[0]
    assert (failure.rank, failure.local_rank, failure.pid, failure.exitcode) == (1, 1, 4001, 3)
    # INFO records are dropped without --debug (the restart notice replaces them)
    assert not [r for r in agent_logs if RESTART_TEXT in str(r.msg)]


def test_elastic_launcher_reports_the_root_cause_before_each_restart(
        agent_logs: list[logging.LogRecord], capsys: pytest.CaptureFixture[str]) -> None:
    from accel.launch.torchrun import _quiet_torch_logs

    results = [_failed(1, 3), agent_api.RunResult(state=agent_api.WorkerState.SUCCEEDED)]
    _quiet_torch_logs(False, roles=None)
    _Agent(results, max_restarts=2)._invoke_run()
    err = capsys.readouterr().err
    before, _, after = err.partition("accel launch: restarting all workers after the failure "
                                     "above, restart 1 of 2 (--max_restarts; state FAILED)")
    assert "ROOT CAUSE: rank 1" in before and "exit code 3" in before, err
    assert "restarting" not in after, err


def test_elastic_new_nodes_restart_is_not_a_failed_attempt(
        agent_logs: list[logging.LogRecord]) -> None:
    healthy = agent_api.RunResult(state=agent_api.WorkerState.HEALTHY)
    results = [healthy, agent_api.RunResult(state=agent_api.WorkerState.SUCCEEDED)]
    seen: list[Restart] = []
    quiet_agent_logs(seen.append, debug=True)
    agent = _Agent(results, max_restarts=1, nodes_waiting=1)
    agent._invoke_run()
    assert agent.restarted == 1 and seen == []  # its record ("... new nodes ...") has 3 args
    joined = [r for r in agent_logs if RESTART_TEXT in str(r.msg)]
    assert len(joined) == 1 and "new nodes" in joined[0].getMessage()  # kept with debug


def test_elastic_walk_gives_up_without_a_result() -> None:
    assert elastic.attempt_failures(sys._getframe()) is None


# ------------------------------------------------------------------ stall.py, attendance.py


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30),
                         wait_for_workers=False)


def test_store_methods_used_by_stall_and_attendance(store: dist.TCPStore) -> None:
    # a monitor's namespace (stall._namespace) with attendance's prefix over it: both nest
    base = dist.PrefixStore("accel/a0/m1/", store)
    for s in (store, base, dist.PrefixStore("attend/", base)):
        s.set("k", "v")
        assert s.get("k") == b"v"
        assert s.check(["k"]) is True and s.check(["k", "absent"]) is False
        assert s.multi_get(["k", "k"]) == [b"v", b"v"]
        assert s.add("n", 1) == 1 and s.add("n", 2) == 3
        # attendance's claims: "" means absent; the answer is the value now stored
        assert s.compare_set("claim", "", "main1") == b"main1"
        assert s.compare_set("claim", "", "late") == b"main1"
        assert s.delete_key("claim") is True and s.delete_key("claim") is False
        assert s.check(["claim"]) is False


def test_store_clone_exists_and_shares_the_namespace(store: dist.TCPStore) -> None:
    # stall's watchdog publishes through its own connection: Store.clone(), absent from stubs
    namespaced = dist.PrefixStore("accel/a0/m1/", store)
    clone = namespaced.clone()
    assert isinstance(clone, dist.Store)
    clone.set("progress/0", "1|2|run")
    assert namespaced.get("progress/0") == b"1|2|run"
    monitor = stall.CollectiveMonitor(rank=0, world_size=2, store=store, threshold=5.0)
    try:
        monitor.publish_progress()  # starts the watchdog, which clones the namespace
        assert monitor.store is not None and monitor._thread is not None
        found = stall.read_progress(monitor.store, [0])
        assert found == {0: stall.Progress(points=0, marks=0)}
    finally:
        monitor.close()


def test_stall_register_atexit_is_there_to_stop_the_watchdog() -> None:
    register = getattr(threading, "_register_atexit", None)
    assert callable(register), "CPython dropped threading._register_atexit"
    params = list(inspect.signature(register).parameters.values())
    assert params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_stall_skips_torch_frames_by_torch_directory() -> None:
    # call_site skips frames whose file is under torch's package directory
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    assert torch_dir in stall._SKIP_DIRS
    for module in (dist.distributed_c10d, torch.nn.parallel.distributed):
        assert os.path.abspath(str(module.__file__)).startswith(torch_dir)
    assert stall.call_site().startswith(os.path.abspath(__file__) + ":")


# ------------------------------------------------------------------ settle.py: /proc states


def _tid_stat(tid: int) -> bytes:
    return Path(f"/proc/self/task/{tid}/stat").read_bytes()


@linux_only
def test_settle_reads_states_where_this_kernel_puts_them() -> None:
    me = threading.get_native_id()
    assert str(me) in os.listdir("/proc/self/task")
    assert thread_state(_tid_stat(me)) == "R"  # reading its own stat, it is running
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def sleeper() -> None:
        tid.append(threading.get_native_id())
        # a name with the characters a naive split trips on (comm is at most 15 bytes)
        Path(f"/proc/self/task/{tid[0]}/comm").write_text("a) R (b")
        ready.set()
        stop.wait(30)

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        assert b"(a) R (b)" in _tid_stat(tid[0])
        deadline = time.monotonic() + 10
        while thread_state(_tid_stat(tid[0])) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread_state(_tid_stat(tid[0])) == "S"  # asleep in Event.wait
        assert tid[0] not in (busy_threads() or [])
    finally:
        stop.set()
        thread.join()


# ------------------------------------------------------------------ env/log.py: turn files


@linux_only
def test_turn_files_read_the_start_time_field_of_proc_stat() -> None:
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    assert fields[0] == "R" and int(fields[1]) == os.getppid()  # fields 3 and 4
    started = _process_start_time()
    parent = _process_start_time(f"/proc/{os.getppid()}/stat")
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime "))
    assert started is not None and parent is not None
    assert boot - 2 <= parent <= started + 1 and started <= time.time()
    # a thread started now has its start in the same field, in the same units
    before = time.time()
    box: list[float | None] = []
    thread = threading.Thread(target=lambda: box.append(
        _process_start_time(f"/proc/self/task/{threading.get_native_id()}/stat")))
    thread.start()
    thread.join()
    after = time.time()
    assert box[0] is not None and before - 2 <= box[0] <= after + 2, (before, box, after)
