"""Stall reports and the signal sync point, in one process (a real TCPStore, fake peers)."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from accel.distributed.health.stall import CollectiveMonitor, call_site, read_positions
from accel.distributed.health.stall_report import Position, format_stall_report, rank_ranges


def test_position_round_trip_and_garbage() -> None:
    pos = Position(rank=3, seq=12, op="reduce:sum", site="/a/b|c.py:7", wall=1700000000.25)
    assert Position.decode(3, pos.encode().encode()) == pos  # '|' in the path survives
    assert Position.decode(1, b"nonsense").seq == -1


def test_rank_ranges() -> None:
    assert rank_ranges([5]) == "rank 5"
    assert rank_ranges([7, 0, 1, 2, 5, 8]) == "ranks 0-2,5,7-8"


def test_report_folds_ranks_and_names_every_state() -> None:
    me = Position(rank=0, seq=5, op="barrier", site="/x/train.py:30", wall=100.0)
    positions = [me, Position(rank=1, seq=4, op="gather", site="/x/train.py:25", wall=99.0),
                 Position(rank=2, seq=4, op="gather", site="/x/train.py:25", wall=99.5), None,
                 Position(rank=4, seq=5, op="gather", site="/x/train.py:33", wall=101.0),
                 Position(rank=5, seq=6, op="reduce:sum", site="/x/train.py:40", wall=101.5),
                 Position(rank=6, seq=0, op="start", site="/x/train.py:3", wall=90.0)]
    text = format_stall_report(me, positions=positions, now=102.0, timeout=6.0, threshold=2.0)
    lines = text.splitlines()
    assert lines[1] == "accel STALL REPORT: rank 0 has waited 2.0 s in collective #5 barrier " \
                       "at /x/train.py:30"
    assert "collective timeout (6 s) ends the job" in lines[2]
    body = "\n".join(lines)
    assert "  rank 0     waiting in #5 barrier at /x/train.py:30 (for 2.0 s)" in body
    assert "  ranks 1-2  not in a collective since #4 gather at /x/train.py:25 (3.0 s ago)" in body
    assert "  rank 3     no position published" in body
    assert "rank 4     waiting in #5 gather at /x/train.py:33 - a DIFFERENT collective" in body
    assert "rank 5     ahead, in #6 reduce:sum at /x/train.py:40" in body
    assert "rank 6     not in a collective; none since start-up at /x/train.py:3" in body
    assert ("MISMATCH at #5, ranks are in 2 different collectives: rank 0 in barrier at "
            "/x/train.py:30; rank 4 in gather at /x/train.py:33; not there: ranks 1-3,5-6 of 7"
            ) in body
    twin = Position(rank=1, seq=5, op="barrier", site="/x/train.py:30", wall=100.5)
    only = format_stall_report(me, positions=[me, twin], now=101.0, timeout=None, threshold=60)
    assert "at #5: ranks 0-1 in barrier at /x/train.py:30 (all 2 ranks arrived)" in only
    assert "no collective timeout is set" in only


def test_call_site_is_the_users_line() -> None:
    here = f"{__file__}:{sys._getframe().f_lineno + 1}"
    assert call_site() == here


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))


def _wait_for(predicate: object, limit: float = 10.0) -> None:
    start = time.monotonic()
    while not predicate() and time.monotonic() - start < limit:  # type: ignore[operator]
        time.sleep(0.02)


def test_stalled_collective_is_reported_once_with_every_rank(store: dist.TCPStore) -> None:
    out0, out1 = io.StringIO(), io.StringIO()
    rank0 = CollectiveMonitor(0, 3, store, threshold=0.2, stream=out0, attempt=2)
    rank1 = CollectiveMonitor(1, 3, store, threshold=0.2, stream=out1, attempt=2)
    with rank0("gather", ()):
        pass
    with rank1("gather", ()):
        pass
    try:
        line = sys._getframe().f_lineno + 1
        with rank0("barrier", ()), rank1("barrier", ()):  # both stuck in the same #2
            _wait_for(lambda: "STALL" in out0.getvalue() + out1.getvalue())
            time.sleep(0.5)  # a second report would have come by now
    finally:
        rank0.close()
        rank1.close()
    text = out0.getvalue() + out1.getvalue()
    assert text.count("accel STALL REPORT") == 1, text
    assert f"ranks 0-1  waiting in #2 barrier at {os.path.relpath(__file__)}:{line}" in text, text
    assert "rank 2     no position published" in text, text
    assert "not there: rank 2 of 3" in text
    positions = read_positions(dist.PrefixStore("accel/a2/m1/", store), 3)
    assert [p.seq if p else None for p in positions] == [2, 2, None]
    assert read_positions(dist.PrefixStore("accel/a0/m1/", store), 3) == [None, None, None]


def test_no_report_below_the_threshold(store: dist.TCPStore) -> None:
    out = io.StringIO()
    monitor = CollectiveMonitor(0, 2, store, threshold=30.0, stream=out)
    for _ in range(100):
        with monitor("reduce:sum", ()):
            pass
    assert monitor.points == 100 and out.getvalue() == ""
    monitor.close()


@pytest.mark.skipif(not hasattr(threading, "_threading_atexits"),
                    reason="this Python has no threading exit hooks")
def test_the_watchdog_stops_as_the_interpreter_exits(store: dist.TCPStore) -> None:
    """Python joins non-daemon threads at exit: the watchdog is told to stop before that join,
    instead of noticing the main thread's end up to one period later."""
    monitor = CollectiveMonitor(0, 2, store, threshold=30.0, stream=io.StringIO())
    with monitor("gather", ()):  # starts the watchdog thread
        pass
    hooks = [hook for hook in threading._threading_atexits  # type: ignore[attr-defined]
             if getattr(hook, "func", hook) == monitor._stop.set]
    assert len(hooks) == 1
    hooks[0]()  # what the interpreter's exit runs before joining threads
    assert monitor._thread is not None
    monitor._thread.join(timeout=5.0)
    assert not monitor._thread.is_alive()


def test_threshold_defaults_to_60_s_or_half_the_timeout() -> None:
    assert CollectiveMonitor(0, 1, None).threshold == 60.0
    assert CollectiveMonitor(0, 1, None, timeout=timedelta(seconds=10)).threshold == 5.0
    assert CollectiveMonitor(0, 1, None, 90.0, timeout=timedelta(seconds=10)).threshold == 90.0


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_signal_runs_the_handler_once_at_the_next_point_then_exits() -> None:
    monitor = CollectiveMonitor(0, 1, None)
    seen: list[tuple[int, int]] = []
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        monitor.on_signal(lambda signum: seen.append((signum, monitor.points)),
                          signals=(signal.SIGUSR1,))
        monitor.point()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)  # the Python-level handler runs; it only sets a flag
        assert seen == []
        with pytest.raises(SystemExit) as info:
            monitor.point()
        assert info.value.code == 128 + signal.SIGUSR1
        assert seen == [(int(signal.SIGUSR1), 2)]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_on_signal_checks_its_arguments() -> None:
    monitor = CollectiveMonitor(0, 1, None)
    with pytest.raises(TypeError, match="needs a callable handler"):
        monitor.on_signal("save")  # type: ignore[arg-type]


def test_a_second_sigint_before_any_sync_point_interrupts_at_once() -> None:
    monitor = CollectiveMonitor(0, 1, None)
    previous = signal.getsignal(signal.SIGINT)
    try:
        monitor.on_signal(lambda signum: None, signals=(signal.SIGINT,))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_progress_is_published_by_the_watchdog_and_ends_with_exit(store: dist.TCPStore) -> None:
    from accel.distributed.health.stall import Progress, read_progress

    monitor = CollectiveMonitor(rank=1, world_size=2, store=store, threshold=0.4)
    prefixed = dist.PrefixStore("accel/a0/m1/", store)
    with monitor("barrier", ()):
        pass
    monitor.mark()
    monitor.mark()  # a batch, a backward: counted, published by the thread (no store call here)
    deadline = time.monotonic() + 5
    while read_progress(prefixed, [1]).get(1) != Progress(points=1, marks=2) and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert read_progress(prefixed, [1]) == {1: Progress(points=1, marks=2)}
    monitor.close()  # end_training: this rank reaches no further sync point
    assert read_progress(prefixed, [1, 0]) == {1: Progress(points=1, marks=2, exited=True)}
