"""Stall reports and signal handlers agreed across ranks, through the c10d store.

``CollectiveMonitor`` is a ``Communicator`` hook. Before every collective issued through accel it
records this rank's position (sequence number, op, and the user's call site ``file:line``) in
memory; a watchdog thread per monitor (started once, reused; it ends with the main thread)
publishes the latest position to the store at most once per period (so the hot path has no store
traffic), and notices a collective still pending after the threshold, reads every rank's
position from the store - never through the blocked collective - and prints ONE report per
stall on stderr: which ranks arrived at which op, and where the others are. The process-group
timeout then ends the job.

The same sequence of "sync points" (collectives, plus ``point()`` calls) lets a signal handler
run on every rank at the same point: see ``on_signal``. With the count of "progress marks"
(local events every rank passes in the same order: a batch from a prepared loader, the start
and end of a backward; see ``mark``) it also tells where a rank is without asking it: the
watchdog publishes both counts as the rank's :class:`Progress`, which
:mod:`accel.distributed.health.attendance` compares across ranks.

Example:
    >>> monitor = CollectiveMonitor(rank=0, world_size=1, store=None)
    >>> with monitor("barrier", ()):
    ...     pass
    >>> monitor.points
    1
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, TextIO

import torch
import torch.distributed as dist

from .stall_report import Position, format_stall_report

__all__ = ["DEFAULT_STALL_SECONDS", "CollectiveMonitor", "Progress", "call_site",
           "read_positions", "read_progress"]

DEFAULT_STALL_SECONDS = 60.0
_PREFIX = "stall/"
_PROGRESS = "progress/"
_REQUEST = "signal/request"
_SEEN = "signal/seen/"
#: How long ranks wait for each other to agree on where to run a signal handler (seconds).
_AGREE_SECONDS = 20.0  # below torchelastic's 30 s between SIGTERM and SIGKILL

_ACCEL_DIR = os.path.abspath(__file__).rsplit(os.sep, __name__.count("."))[0]  # the accel package
_SKIP_DIRS = (_ACCEL_DIR + os.sep,
              os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
_SKIP_FILES = frozenset(os.path.abspath(m.__file__) for m in (contextlib, functools, threading)
                        if m.__file__)


def call_site(frame: FrameType | None = None) -> str:
    """``file:line`` of the innermost frame outside accel, torch and contextlib/functools."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and name not in _SKIP_FILES:
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Where a rank is: sync points and progress marks passed, and whether it has stopped.

    Every rank passes the same points and marks in the same order, so comparing two ranks'
    counts says which one is ahead (a rank with more of either has gone past the other's place).
    """

    points: int
    marks: int
    exited: bool = False  # its monitor stopped (end_training, or the interpreter exits)

    def encode(self) -> str:
        return f"{self.points}|{self.marks}|{'exit' if self.exited else 'run'}"

    @classmethod
    def decode(cls, raw: bytes | str) -> Progress | None:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        try:
            points, marks, state = text.split("|")
            return cls(points=int(points), marks=int(marks), exited=state == "exit")
        except ValueError:
            return None

    def beyond(self, other: Progress) -> bool:
        """True when this rank has gone past ``other``'s place (or stopped)."""
        return self.exited or self.points > other.points or self.marks > other.marks

    def level(self, other: Progress) -> bool:
        return (self.points, self.marks) == (other.points, other.marks)


class _Scope:
    """Context manager of one collective (tiny: the hook runs around every collective)."""

    __slots__ = ("monitor", "op")

    def __init__(self, monitor: CollectiveMonitor, op: str) -> None:
        self.monitor, self.op = monitor, op

    def __enter__(self) -> None:
        self.monitor._enter(self.op)

    def __exit__(self, *exc: object) -> None:
        self.monitor._exit()


class CollectiveMonitor:
    """Publishes this rank's position before each collective; reports stalls; runs signal handlers.

    Args:
        rank, world_size: this process's place in the job.
        store: the c10d store of the default group (``None`` at world size 1).
        threshold: seconds a collective may wait before the stall report (default 60; capped
            at half the timeout unless given explicitly).
        timeout: the process-group timeout, quoted in the report.
        stream: where reports go (default ``sys.stderr``).
        attempt: the launcher's restart count; keys live under ``accel/a<attempt>/m<n>/``
            because a restarted job may find the previous attempt's keys in the same store, and
            because a process may build several monitors (one per ``Accelerator``: a notebook
            cell run again) whose threads outlive their use: ``n`` counts this rank's monitors
            on the store, so the n-th monitor of every rank shares one namespace and an earlier
            one (ended, or with other counts) never speaks for it. Every rank must therefore
            build its monitors (its Accelerators) in the same order, as it runs the same script.
    """

    def __init__(self, rank: int, world_size: int, store: dist.Store | None,
                 threshold: float | None = None, timeout: timedelta | None = None,
                 stream: TextIO | None = None, attempt: int = 0) -> None:
        self.rank, self.world_size = rank, world_size
        self._store = _namespace(store, rank, attempt) if store is not None else None
        seconds = timeout.total_seconds() if timeout else None
        if threshold is None:
            threshold = DEFAULT_STALL_SECONDS if seconds is None else \
                min(DEFAULT_STALL_SECONDS, seconds / 2)
        self.threshold = float(threshold)
        self.timeout = seconds
        self._stream = stream
        self._key = f"{_PREFIX}{rank}"
        self.points = 0  # sync points passed (collectives at depth 1 and point() calls)
        self.marks = 0  # progress marks (see mark())
        self._depth = 0
        self._pending: tuple[int, str, str, float] | None = None
        self._last: tuple[int, str, str, float] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._period = max(0.05, min(0.5, self.threshold / 4))
        # signal agreement (see on_signal); _lock guards points/_requested/_agreed
        self._lock = threading.Lock()
        self._agreed_cv = threading.Condition(self._lock)
        self._handler: Callable[[int], None] | None = None
        self._local_signal: int | None = None
        self._requested: int | None = None
        self._agreed: int | None = None
        self._handling = False
        self._publish(0, op="start", site=call_site(sys._getframe(1)))

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy lives in another process (a DataLoader worker started with spawn, say) that
        # cannot reach this one's store or threads: it is a monitor without a store, which
        # publishes nothing and never reports.
        timeout = timedelta(seconds=self.timeout) if self.timeout is not None else None
        return (CollectiveMonitor, (self.rank, self.world_size, None, self.threshold, timeout))

    # -- the hook --------------------------------------------------------------------------
    def __call__(self, op: str, leaves: Sequence[torch.Tensor]) -> _Scope:
        return _Scope(self, op)

    def _enter(self, op: str) -> None:
        self._depth += 1
        if self._depth == 1:
            seq = self._point()
        else:  # collectives inside a signal handler: counted, never a new agreement
            self.points += 1
            seq = self.points
        site = call_site(sys._getframe(2))
        # No store traffic here (this runs before every collective): the watchdog thread
        # publishes the latest position within one period.
        self._last = (seq, op, site, time.time())
        self._pending = (seq, op, site, time.monotonic())
        if self._thread is None and self._store is not None:
            self._start_thread()

    def _exit(self) -> None:
        self._depth -= 1
        self._pending = None

    # -- progress ------------------------------------------------------------------------------
    def mark(self) -> None:
        """Count a progress mark: a local event that every rank passes in the same order.

        Called by accel for each batch of a prepared loader and before and after each
        ``backward``, so that another rank can tell, from the published counts alone, whether
        this one has gone past its own place (see :mod:`accel.distributed.health.attendance`). Costs
        an increment; the watchdog thread publishes the count.
        """
        self.marks += 1
        if self._thread is None and self._store is not None:
            self._start_thread()

    @property
    def progress(self) -> Progress:
        """This rank's sync points and progress marks so far."""
        return Progress(points=self.points, marks=self.marks)

    @property
    def store(self) -> dist.Store | None:
        """The store this monitor publishes to (keys under ``accel/a<attempt>/``), or None."""
        return self._store

    def publish_progress(self) -> None:
        """Publish :attr:`progress` now (from the calling thread) and keep publishing it."""
        if self._store is None:
            return
        self._store.set(f"{_PROGRESS}{self.rank}", self.progress.encode())
        if self._thread is None:
            self._start_thread()

    def _publish(self, seq: int, *, op: str, site: str, when: float | None = None,
                 store: dist.Store | None = None) -> None:
        store = store if store is not None else self._store
        if store is None:
            return
        try:
            # Position.encode's format
            stamp = when if when is not None else time.time()
            store.set(self._key, f"{seq}|{stamp:.3f}|{op}|{site}")
        except RuntimeError as exc:  # the store is gone: the job is ending; stop publishing
            self._store = None
            self._say(f"stall reports disabled, the c10d store is unreachable: {exc}")

    # -- sync points and signals -----------------------------------------------------------
    def point(self) -> None:
        """A sync point outside any collective (``Accelerator.check_signal``): call on all ranks."""
        if self._depth == 0:
            self._point()

    def _point(self) -> int:
        if self._handler is None or self._handling:
            self.points += 1
            return self.points
        with self._lock:
            if self._requested is None and self._local_signal is None:
                self.points += 1
                return self.points
        return self._slow_point()

    def on_signal(self, handler: Callable[[int], None],
                  signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Run ``handler(signum)`` once on every rank at the same sync point, then exit.

        When any rank receives one of ``signals``, every rank stops at the next sync point that
        no rank has reached yet (a collective issued through accel, or ``point()``), all call
        ``handler(signum)`` there - so collectives such as ``save_state`` work inside it - and
        then raise ``SystemExit(128 + signum)``. A second signal before that point stops the
        process at once, as without a handler. Must be called on every rank, in the main thread.
        """
        if not callable(handler):
            raise TypeError(f"on_signal() needs a callable handler(signum), got {handler!r}")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("on_signal() must be called from the main thread (Python only "
                               "delivers signals there)")
        if self.world_size > 1 and self._store is None:
            raise RuntimeError("on_signal() needs the process group's c10d store to agree "
                               "across ranks, and this process group has none")
        for sig in signals:
            signal.signal(sig, self._on_os_signal)
        self._handler = handler
        if self._store is not None and self._thread is None:
            self._start_thread()

    def _on_os_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the main thread: only set a flag (no locks, no I/O).
        if self._local_signal is None:
            self._local_signal = signum
            return
        if self._handling:
            return  # the handler is saving: let it finish
        # A second signal before any sync point came: stop now, as without on_signal.
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _request(self, signum: int, store: dist.Store | None) -> None:
        """Freeze this rank's point count and publish it (once); used by both threads."""
        with self._lock:
            if self._requested is not None:
                return
            self._requested = signum
            entered = self.points
            if store is None:  # one process: stop at the very next point
                self._agreed = entered + 1
                self._agreed_cv.notify_all()
                return
        store.compare_set(_REQUEST, "", str(signum))
        store.set(f"{_SEEN}{self.rank}", str(entered))

    def _slow_point(self) -> int:
        if self._requested is None:
            self._request(int(self._local_signal or signal.SIGTERM), self._store)
        deadline = time.monotonic() + _AGREE_SECONDS
        with self._agreed_cv:
            while self._agreed is None and time.monotonic() < deadline:
                self._agreed_cv.wait(min(self._period, max(deadline - time.monotonic(), 0.0)))
            agreed = self._agreed
            self.points += 1
            here = self.points
        signum = int(self._requested or signal.SIGTERM)
        name = signal.Signals(signum).name
        if agreed is None:
            self._say(f"{name} received but the ranks could not agree on a point to run the "
                      f"on_signal handler within {_AGREE_SECONDS:.0f} s; exiting without it")
            raise SystemExit(128 + signum)
        if here < agreed:
            return here
        if here > agreed:  # cannot happen when every rank runs the same sync points
            raise RuntimeError(f"rank {self.rank} passed sync point #{agreed} chosen for the "
                               f"{name} handler (now at #{here}); ranks ran different collectives")
        self._run_handler(signum, name, here)
        return here

    def _run_handler(self, signum: int, name: str, here: int) -> None:
        self._say(f"{name} received: running the on_signal handler at sync point #{here} "
                  f"(agreed by all {self.world_size} rank(s))")
        handler, self._handling = self._handler, True
        try:
            # Not None: _point() only comes here while a handler is set.
            handler(signum)  # type: ignore[misc]
        finally:
            self._handling, self._handler = False, None  # once: later points are plain again
        self._say(f"on_signal handler done; exiting with {128 + signum}")
        raise SystemExit(128 + signum)

    # -- the watchdog thread ---------------------------------------------------------------
    def _start_thread(self) -> None:
        # Not a daemon: a daemon thread could be inside the store's C++ code while the
        # interpreter finalises. (The SIGABRT at exit first blamed on this was the gloo race
        # that accel.distributed.health.settle handles.)
        # The loop ends when the interpreter exits (or within one period of the main thread
        # finishing, where the exit hook is unavailable).
        self._thread = threading.Thread(target=self._watch, name=f"accel-monitor-{self.rank}",
                                        daemon=False)
        self._thread.start()
        # At interpreter exit, stop it before Python joins non-daemon threads, rather than
        # after up to one period (CPython's hook for this, used by concurrent.futures too).
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            try:
                register(self._stop.set)
            except RuntimeError:  # the interpreter is already shutting down
                self._stop.set()

    def _watch(self) -> None:
        if self._store is None:
            return
        try:
            # its own connection: never waits on the main thread. (Store.clone() exists at run
            # time but is missing from torch's stub.)
            store = self._store.clone()  # type: ignore[attr-defined]
        except RuntimeError:  # a store without clone(): share the main thread's connection
            store = self._store
        reported = -1
        published = None
        progress = None
        main = threading.main_thread()
        while not self._stop.wait(self._period) and main.is_alive():
            try:
                last = self._last
                if last is not published and last is not None:
                    seq, op, site, when = last
                    self._publish(seq, op=op, site=site, when=when, store=store)
                    published = last
                now = self.progress
                if now != progress:
                    store.set(f"{_PROGRESS}{self.rank}", now.encode())
                    progress = now
                pending = self._pending
                if pending is not None and pending[0] != reported and \
                        time.monotonic() - pending[3] >= self.threshold:
                    reported = pending[0]
                    self._report(store, pending)
                if self._handler is not None and self._agreed is None:
                    self._agree(store)
            except RuntimeError as exc:  # the store went away: the job is over
                if not self._stop.is_set():
                    self._say(f"monitor stopped, the c10d store is unreachable: {exc}")
                return
        with contextlib.suppress(RuntimeError):  # the store may be gone already
            # this rank will not reach another sync point through this monitor
            exited = Progress(points=self.points, marks=self.marks, exited=True)
            store.set(f"{_PROGRESS}{self.rank}", exited.encode())

    def _agree(self, store: dist.Store) -> None:
        if self._requested is None:
            local = self._local_signal
            if local is None and store.check([_REQUEST]):
                local = int(store.get(_REQUEST))
            if local is None:
                return
            self._request(local, store)
        keys = [f"{_SEEN}{r}" for r in range(self.world_size)]
        if not store.check(keys):
            return
        agreed = max(int(v) for v in store.multi_get(keys)) + 1
        with self._agreed_cv:
            self._agreed = agreed
            self._agreed_cv.notify_all()

    def _report(self, store: dist.Store, pending: tuple[int, str, str, float]) -> None:
        seq, op, site, started = pending
        if store.add(f"{_PREFIX}report/{seq}", 1) != 1:
            return  # another waiting rank printed this stall already
        positions = read_positions(store, self.world_size)
        mine = Position(rank=self.rank, seq=seq, op=op, site=site,
                        wall=time.time() - (time.monotonic() - started))
        text = format_stall_report(mine, positions=positions, now=time.time(), timeout=self.timeout,
                                   threshold=self.threshold)
        print(text, file=self._stream or sys.stderr, flush=True)

    def _say(self, message: str) -> None:
        print(f"[accel] rank {self.rank}: {message}", file=self._stream or sys.stderr, flush=True)

    def close(self) -> None:
        """Stop the watchdog thread and wait for it (the process group is about to end)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)


def _namespace(store: dist.Store, rank: int, attempt: int) -> dist.Store:
    """The keys of this rank's next monitor in ``store``: ``accel/a<attempt>/m<n>/``, ``n``
    counting this rank's monitors there (one store call, no collective)."""
    number = dist.PrefixStore(f"accel/a{attempt}/", store).add(f"monitors/{rank}", 1)
    return dist.PrefixStore(f"accel/a{attempt}/m{number}/", store)


def read_progress(store: dist.Store, ranks: Sequence[int]) -> dict[int, Progress]:
    """The published :class:`Progress` of ``ranks`` (a rank that published none is left out)."""
    keys = [f"{_PROGRESS}{r}" for r in ranks]
    if store.check(keys):
        return {r: p for r, raw in zip(ranks, store.multi_get(keys), strict=True)
                if (p := Progress.decode(raw)) is not None}
    found = {}
    for rank, key in zip(ranks, keys, strict=True):
        if store.check([key]) and (p := Progress.decode(store.get(key))) is not None:
            found[rank] = p
    return found


def read_positions(store: dist.Store, world_size: int) -> list[Position | None]:
    """Every rank's last published position (``None`` for a rank that published nothing)."""
    keys = [f"{_PREFIX}{r}" for r in range(world_size)]
    raw: Sequence[bytes | None]
    if store.check(keys):
        raw = store.multi_get(keys)
    else:
        raw = [store.get(k) if store.check([k]) else None for k in keys]
    return [Position.decode(r, value) if value is not None else None
            for r, value in enumerate(raw)]

