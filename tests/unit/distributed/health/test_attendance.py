"""``Attendance``: rank 0 learns through the store, never a collective, who takes part.

Two "ranks" are two monitors and two attendances in threads of one process, over one real
TCPStore: each decision (everyone arrived, a rank went on, a rank is behind then arrives, a
rank level but silent, a late arrival, a rank that calls alone) without spawning processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from accel.distributed.health.attendance import Attendance, Roll
from accel.distributed.health.stall import CollectiveMonitor, Progress

LEVEL_WAIT = 0.6


@pytest.fixture
def ranks() -> Iterator[tuple[Attendance, Attendance]]:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30),
                          wait_for_workers=False)
    monitors = [CollectiveMonitor(r, 2, store, threshold=4.0) for r in (0, 1)]
    yield (Attendance(monitors[0], level_wait=LEVEL_WAIT),
           Attendance(monitors[1], level_wait=LEVEL_WAIT))
    for monitor in monitors:
        monitor.close()


def _in_thread(fn: Callable[[], Any], delay: float = 0.0) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        time.sleep(delay)
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - the test checks it
            out.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _published(att: Attendance) -> None:
    att.monitor.publish_progress()


def test_progress_encodes_and_compares() -> None:
    here = Progress(points=3, marks=7)
    assert Progress.decode(here.encode()) == here and Progress.decode("junk") is None
    assert Progress(points=4, marks=7).beyond(here) and Progress(points=3, marks=8).beyond(here)
    assert Progress(points=1, marks=1, exited=True).beyond(here)
    assert Progress(points=3, marks=7).level(here) and not Progress(points=3, marks=6).beyond(here)


def test_every_rank_arrives_even_late(ranks: tuple[Attendance, Attendance]) -> None:
    zero, one = ranks
    _published(one)
    # rank 1 arrives after rank 0 began waiting (level with it, silent, within the level wait)
    thread, joined = _in_thread(one.join, delay=LEVEL_WAIT / 2)
    roll = zero.convene()
    thread.join()
    assert roll.everyone and roll.present == (1,) and joined[0].everyone
    # and again, rank 1 first this time (nothing is left over from the last one)
    thread, joined = _in_thread(one.join)
    time.sleep(0.1)
    roll = zero.convene()
    thread.join()
    assert roll.everyone and joined[0].everyone and roll.number == joined[0].number


def test_rolls_that_everyone_joined_leave_no_keys_behind(
        ranks: tuple[Attendance, Attendance]) -> None:
    # found by benchmarks/soak.py: a save every few steps added 2 keys to the job's store each
    # time (the ``at`` place and the claim of rank 1's arrival), for the whole run
    zero, one = ranks
    store = zero.monitor.store
    assert store is not None
    counts = []
    for index in range(6):
        thread, joined = _in_thread(one.join, delay=0.05 * (index % 2))  # either one first
        roll = zero.convene()
        thread.join()
        assert roll.everyone and joined[0].everyone and roll.number == joined[0].number
        counts.append(store.num_keys())
        for att in ranks:  # the save's collectives: both ranks pass a sync point
            att.monitor.point()
    assert len(set(counts[1:])) == 1, counts  # flat after the first roll (its own keys)


def test_rolls_rank_0_did_alone_leave_no_keys_once_the_others_are_past(
        ranks: tuple[Attendance, Attendance]) -> None:
    # save_state under `if accelerator.is_main_process:` (diffusers): rank 1 never calls it
    zero, one = ranks
    store = zero.monitor.store
    assert store is not None
    counts = []
    for _ in range(5):
        one.monitor.mark()  # rank 1 took its next batch: it is past the place of the save
        _published(one)
        roll = zero.convene()
        assert not roll.everyone and "went on" in roll.reason
        zero.finish(roll, "/ckpt", None)
        counts.append(store.num_keys())
        zero.monitor.mark()
    assert len(set(counts[1:])) == 1, counts
    # a rank that is not past the place yet can still arrive late and hear the outcome
    _published(one)
    roll = zero.convene()  # level and silent: goes on alone after the level wait
    zero.finish(roll, "/ckpt/late", None)
    zero.monitor.mark()
    _published(zero)
    zero._forget_alone(store)  # what its next convene() does first: rank 1 is not past it
    late = one.join()
    assert late.late and one.outcome(late) == ("/ckpt/late", None)


def test_a_rank_that_went_on_ends_the_wait_at_once(ranks: tuple[Attendance, Attendance]) -> None:
    zero, one = ranks
    one.monitor.mark()  # took its next batch
    _published(one)
    roll = zero.convene()
    assert not roll.everyone and roll.absent == (1,) and not roll.timed_out
    assert "went on" in roll.reason and roll.waited < LEVEL_WAIT
    zero.finish(roll, "/ckpt", None)


def test_a_rank_behind_is_waited_for(ranks: tuple[Attendance, Attendance]) -> None:
    zero, one = ranks
    zero.monitor.mark()
    _published(one)  # one mark behind: still in its step

    def catch_up() -> Roll:
        time.sleep(2 * LEVEL_WAIT)  # longer than the level wait: behind has no clock of its own
        one.monitor.mark()
        return one.join()
    thread, joined = _in_thread(catch_up)
    roll = zero.convene()
    thread.join()
    assert roll.everyone and joined[0].everyone


def test_level_and_silent_waits_then_goes_on_and_the_late_rank_takes_the_outcome(
        ranks: tuple[Attendance, Attendance]) -> None:
    zero, one = ranks
    _published(one)
    roll = zero.convene()
    assert not roll.everyone and roll.timed_out and "neither called it" in roll.reason
    assert roll.waited >= LEVEL_WAIT
    zero.finish(roll, "/ckpt/checkpoint_3", None)
    late = one.join()  # it came after all: it learns rank 0 went on alone, without a hang
    assert late.late and not late.everyone and late.number == roll.number
    assert one.outcome(late) == ("/ckpt/checkpoint_3", None)


def test_arrivals_of_a_partial_roll_are_answered_and_hear_a_failure() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    monitors = [CollectiveMonitor(r, 3, store, threshold=4.0) for r in range(3)]
    zero, one, two = (Attendance(m, level_wait=LEVEL_WAIT) for m in monitors)
    try:
        two.monitor.mark()  # rank 2 went on; rank 1 calls too (is_local_main_process, say)
        _published(two)
        thread, joined = _in_thread(one.join)
        time.sleep(0.1)
        roll = zero.convene()
        zero.finish(roll, "", "disk full")
        thread.join()
        assert roll.present == (1,) and roll.absent == (2,) and not roll.everyone
        assert not joined[0].everyone and not joined[0].late
        assert one.outcome(joined[0]) == ("", "disk full")
    finally:
        for monitor in monitors:
            monitor.close()


def test_a_rank_calling_alone_is_told_so(ranks: tuple[Attendance, Attendance]) -> None:
    zero, one = ranks
    zero.monitor.mark()
    _published(zero)  # rank 0 is past the place where rank 1 calls
    with pytest.raises(RuntimeError, match="rank 0 went on without calling it"):
        one.join()


def test_one_process_needs_no_store() -> None:
    att = Attendance(CollectiveMonitor(rank=0, world_size=1, store=None))
    assert att.convene().everyone and att.join().everyone


def test_an_earlier_monitor_of_the_same_rank_never_speaks_for_a_later_one() -> None:
    # a notebook cell run again builds a second Accelerator; the first one's monitor has ended
    # (or lives on with other counts) and its thread still publishes: under one namespace rank
    # 0 read "rank 1 ended" and saved alone
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30),
                          wait_for_workers=False)
    first = [CollectiveMonitor(r, 2, store, threshold=4.0) for r in (0, 1)]
    for _ in range(3):
        first[1].mark()
    first[1].publish_progress()
    first[1].close()  # publishes that rank 1's first monitor ended
    second = [CollectiveMonitor(r, 2, store, threshold=4.0) for r in (0, 1)]
    try:
        zero, one = (Attendance(m, level_wait=LEVEL_WAIT) for m in second)
        thread, joined = _in_thread(one.join, delay=LEVEL_WAIT / 2)  # rank 0 looks first
        roll = zero.convene()
        thread.join()
        assert roll.everyone and roll.present == (1,) and joined[0].everyone, roll
        stores = [m.store for m in first + second]
        assert len({id(s) for s in stores}) == 4 and None not in stores
    finally:
        for monitor in first + second:
            monitor.close()
