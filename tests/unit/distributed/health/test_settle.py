"""``accel.distributed.health.settle``: releasing the GIL until other threads are idle, bounded."""

from __future__ import annotations

import hashlib
import sys
import threading
import time

import pytest

from accel.distributed.health.settle import busy_threads, settle

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="thread states are read from /proc")


def spinner(seconds: float, stop: threading.Event | None = None) -> threading.Thread:
    """A thread that stays runnable for ``seconds`` (or until ``stop`` is set), like a collective
    worker: mostly in C code without the GIL (hashing large buffers releases it)."""
    stop = stop or threading.Event()
    data = bytes(8 << 20)

    def spin() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            hashlib.sha256(data).digest()

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    return thread


def test_busy_threads_sees_a_running_thread_and_not_the_caller() -> None:
    stop = threading.Event()
    thread = spinner(10.0, stop)
    seen: list[int] = []
    for _ in range(200):  # the spinner is runnable whenever this thread sleeps
        time.sleep(0.001)
        seen += busy_threads() or []
        if thread.native_id in seen:
            break
    assert thread.native_id in seen
    assert threading.get_native_id() not in seen
    stop.set()
    thread.join()


def test_settle_waits_until_a_busy_thread_has_finished() -> None:
    thread = spinner(0.3)
    assert settle(limit=10.0) is True
    assert not thread.is_alive()  # it returned only once the other thread was done


def test_settle_is_bounded_by_its_limit() -> None:
    stop = threading.Event()
    thread = spinner(10.0, stop)
    assert settle(limit=0.2) is False
    assert thread.is_alive()  # gave up instead of waiting for it
    stop.set()
    thread.join()


def test_settle_returns_at_once_in_an_idle_process() -> None:
    assert settle(limit=10.0) is True
