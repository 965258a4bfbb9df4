"""Who takes part in an operation that every rank may call, or the main process alone.

Scripts written for Accelerate call ``accelerator.save_state()`` either on every rank or under
``if accelerator.is_main_process:`` (the diffusers scripts). A collective on rank 0 alone would
hang, so before any collective rank 0 finds out, through the c10d store and never through a
collective, whether the other ranks are coming:

- a rank that calls the operation says so at once (``arrive/<rank>``: its :class:`Progress`);
- every rank's monitor publishes its progress (sync points and progress marks, see
  :class:`~accel.distributed.health.stall.CollectiveMonitor`) at most one watchdog period late.

Rank 0 compares each other rank with its own place. Arrived at the same place: it takes part.
Gone past it (more points or marks: it entered a collective, took a batch, began a backward,
or ended): it is not coming, and rank 0 goes on alone at once. Behind: it is still on its way
(a slower step), and rank 0 waits for it (up to ``behind_wait``). Level but silent (it finished
the same step but has neither arrived nor moved on): only such a rank costs a bounded wait
(``level_wait``), after which rank 0 goes on alone.

A rank that arrives after rank 0 went on alone finds that out from the store (no collective,
no hang): it takes the outcome of rank 0's operation (and is told it came late). Each arrival
is claimed once (``compare_set``), either by rank 0 (who then answers it) or by its own rank
(who then takes the outcome), so the two can never disagree about whether a rank took part.

Example:
    >>> from accel.distributed.health.stall import CollectiveMonitor
    >>> attendance = Attendance(CollectiveMonitor(rank=0, world_size=1, store=None))
    >>> attendance.convene().everyone
    True
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .stall import CollectiveMonitor, Progress, read_progress

__all__ = ["DEFAULT_LEVEL_WAIT", "Attendance", "Roll"]

#: Seconds rank 0 waits for a rank that is level with it but neither arrives nor moves on.
DEFAULT_LEVEL_WAIT = 10.0
_PREFIX = "attend/"
_POLL = (0.0005, 0.05)  # first and longest sleep between two looks at the store (seconds)


@dataclass(frozen=True, kw_only=True, slots=True)
class Roll:
    """Who takes part in operation ``number`` (numbered by rank 0, once per store).

    On rank 0 ``present`` are the other ranks that arrived, ``absent`` those that did not; on
    the other ranks ``late`` says that this rank arrived after rank 0 went on alone.
    """

    number: int
    everyone: bool
    present: tuple[int, ...] = ()
    absent: tuple[int, ...] = ()
    reason: str = ""  # rank 0, not everyone: why it went on without the others
    timed_out: bool = False  # ... because a wait ran out (not because a rank was seen going on)
    late: bool = False
    waited: float = 0.0  # seconds spent finding out


@dataclass(kw_only=True, slots=True)
class _Peer:
    nonce: str = ""  # its arrival claimed for this operation
    seen: Progress | None = None
    since: float = 0.0  # when rank 0 first saw it at ``seen``


class Attendance:
    """Agree on who takes part, through the store of ``monitor`` (one per ``Accelerator``).

    Args:
        monitor: this rank's collective monitor (its progress and store).
        level_wait: seconds rank 0 waits for a rank level with it that neither arrives nor
            moves on (the one undecided case in a working job).
        behind_wait: seconds rank 0 waits for a rank behind it, a safety net: a rank behind
            is inside the same step, and DDP keeps ranks within one step of each other
            (default: the monitor's stall threshold, at least ``level_wait``).
        timeout: seconds another rank waits for rank 0 to reach the operation (default: 30 min).
    """

    def __init__(self, monitor: CollectiveMonitor, level_wait: float = DEFAULT_LEVEL_WAIT,
                 behind_wait: float | None = None, timeout: timedelta | None = None) -> None:
        self.monitor = monitor
        self.rank, self.world_size = monitor.rank, monitor.world_size
        store = monitor.store  # where monitors publish their progress
        self._progress = store
        self._store = dist.PrefixStore(_PREFIX, store) if store is not None else None
        self.level_wait = float(level_wait)
        self.behind_wait = float(behind_wait if behind_wait is not None
                                 else max(monitor.threshold, self.level_wait))
        self.timeout = timeout.total_seconds() if timeout is not None else 1800.0
        self._calls = 0  # this rank's arrivals (their nonces)
        self._taken: set[int] = set()  # operations this rank took part in or took the outcome of
        self._done_at = ""  # rank 0: the ``at`` key of its last operation that everyone joined
        self._alone: list[tuple[Progress, int]] = []  # rank 0: places and numbers of the
        # operations it did alone whose keys a late rank may still read

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy in another process (a DataLoader worker started with spawn that captured the
        # Accelerator) cannot reach this job's store: it is built on the copied monitor, which
        # has no store, and so never convenes anyone.
        timeout = timedelta(seconds=self.timeout)
        return (Attendance, (self.monitor, self.level_wait, self.behind_wait, timeout))

    # -- rank 0 ----------------------------------------------------------------------------------
    def convene(self) -> Roll:
        """Rank 0: find out whether every other rank takes part (returns at once when all have
        arrived, or when one has gone past; waits only for ranks behind or level)."""
        store = self._store
        if store is None or self.world_size == 1:
            return Roll(number=0, everyone=True)
        start = time.monotonic()
        number = store.add("count", 1)
        here = self.monitor.progress
        self.monitor.publish_progress()
        if self._done_at:  # every rank of that one has left join() since (then came its
            store.delete_key(self._done_at)  # collectives): no one reads it again
            self._done_at = ""
        self._forget_alone(store)
        store.set(self._at(here), f"{number}|open")
        peers = {r: _Peer() for r in range(1, self.world_size)}
        reason, timed_out, delay = "", False, _POLL[0]
        while True:
            self._claim_arrivals(store, peers=peers, here=here, number=number)
            waiting = [r for r, p in peers.items() if not p.nonce]
            if not waiting:
                break
            reason, timed_out = self._gone_on(store, peers=peers, waiting=waiting, here=here,
                                              start=start)
            if reason:
                break
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL[1])
        present = tuple(r for r, p in peers.items() if p.nonce)
        everyone = len(present) == self.world_size - 1
        store.set(self._at(here), f"{number}|{'all' if everyone else 'alone'}")
        for rank in present:  # each waits in join() for exactly this answer
            store.set(f"answer/{rank}/{peers[rank].nonce}",
                      f"{number}|{'all' if everyone else 'alone'}")
        if everyone:  # a late arrival reads ``at`` only after an operation rank 0 did alone
            self._done_at = self._at(here)
        else:
            self._alone.append((here, number))
        return Roll(number=number, everyone=everyone, present=present,
                    absent=tuple(r for r in peers if r not in present), reason=reason,
                    timed_out=timed_out, waited=time.monotonic() - start)

    def finish(self, roll: Roll, target: str, error: str | None) -> None:
        """Rank 0, after going on alone: publish the outcome (``target``, or ``error``) for the
        ranks that arrived or will arrive late (they wait for it in :meth:`outcome`)."""
        if self._store is not None and not roll.everyone:
            self._store.set(f"done/{roll.number}",
                            f"ok|{target}" if error is None else f"error|{error}")

    def _forget_alone(self, store: dist.Store) -> None:
        """Delete the keys of operations rank 0 did alone once every other rank is past their
        place: none of them can arrive there any more (a save on the main process only, as in
        the diffusers scripts, would otherwise add two keys per save for the whole run)."""
        if not self._alone or self._progress is None:
            return
        others = range(1, self.world_size)
        found = read_progress(self._progress, others)
        kept = []
        for place, number in self._alone:
            if all(r in found and found[r].beyond(place) for r in others):
                store.delete_key(self._at(place))
                store.delete_key(f"done/{number}")
            else:
                kept.append((place, number))
        self._alone = kept

    def _claim_arrivals(self, store: dist.Store, *, peers: dict[int, _Peer], here: Progress,
                        number: int) -> None:
        for rank, peer in peers.items():
            key = f"arrive/{rank}"
            if peer.nonce or not store.check([key]):
                continue
            nonce, _, place = store.get(key).decode().partition("|")
            at = Progress.decode(place)
            if at is None or not at.level(here):
                continue  # an arrival elsewhere: judged by its progress
            if store.compare_set(f"claim/{rank}/{nonce}", "", f"main{number}") \
                    == f"main{number}".encode():
                peer.nonce = nonce

    def _gone_on(self, store: dist.Store, *, peers: dict[int, _Peer], waiting: list[int],
                 here: Progress, start: float) -> tuple[str, bool]:
        """Why rank 0 goes on without the ``waiting`` ranks now ("" to wait on), and whether
        because a wait ran out."""
        now = time.monotonic()
        found = read_progress(self._progress, waiting) if self._progress is not None else {}
        for rank in waiting:
            seen, peer = found.get(rank), peers[rank]
            if seen is not None and seen.beyond(here):
                return (f"rank {rank} went on without calling it ("
                        f"{'it ended' if seen.exited else 'it is past this point'})"), False
            if seen != peer.seen:
                peer.seen, peer.since = seen, now
            if seen is not None and seen.level(here):
                if now - peer.since >= self.level_wait:
                    return (f"rank {rank} finished the same step but neither called it nor "
                            f"went on within {self.level_wait:g} s"), True
            elif now - start >= self.behind_wait:
                return (f"rank {rank} did not reach this point within "
                        f"{self.behind_wait:g} s"), True
        return "", False

    @staticmethod
    def _at(place: Progress) -> str:
        return f"at/{place.points}.{place.marks}"

    # -- other ranks -----------------------------------------------------------------------------
    def join(self) -> Roll:
        """Another rank: wait until rank 0 reaches the operation at this rank's place.

        Returns ``everyone=True`` when every rank takes part; otherwise rank 0 goes on alone
        (``late``: it already had when this rank arrived) and :meth:`outcome` says how it ended.

        Raises:
            RuntimeError: rank 0 went on past this point without calling the operation, or
                did not reach it within the timeout.
        """
        store = self._store
        if store is None or self.world_size == 1:
            return Roll(number=0, everyone=True)
        start = time.monotonic()
        self._calls += 1
        nonce, here = f"{self.rank}n{self._calls}x{int(time.time() * 1e6)}", self.monitor.progress
        self.monitor.publish_progress()
        store.set(f"arrive/{self.rank}", f"{nonce}|{here.encode()}")
        delay, said = _POLL[0], False
        while True:
            roll = self._answered(store, nonce) or self._late(store, nonce, here)
            if roll is not None:
                self._taken.add(roll.number)
                return Roll(number=roll.number, everyone=roll.everyone, late=roll.late,
                            waited=time.monotonic() - start)
            waited = time.monotonic() - start
            if waited > self.timeout:
                raise RuntimeError(f"rank {self.rank} waited {waited:.0f} s for rank 0 to reach "
                                   "the same save_state(); call it on every rank, or on the "
                                   "main process only")
            if not said and waited > self.monitor.threshold:
                said = True
                print(f"[accel] rank {self.rank}: save_state() has waited {waited:.0f} s for "
                      "rank 0 to call it too", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL[1])

    def _answered(self, store: dist.Store, nonce: str) -> Roll | None:
        key = f"answer/{self.rank}/{nonce}"
        if not store.check([key]):
            return None
        number, mode = store.get(key).decode().split("|")
        # answered: rank 0 claimed this arrival and reads it no more, so nothing of it stays in
        # the store (a save every few steps would otherwise add keys for the whole run); the
        # arrival goes first, so that its claim is never missing while it can still be read
        for used in (f"arrive/{self.rank}", f"claim/{self.rank}/{nonce}", key):
            store.delete_key(used)
        return Roll(number=int(number), everyone=mode == "all")

    def _late(self, store: dist.Store, nonce: str, here: Progress) -> Roll | None:
        """Rank 0 already went on alone at this place (this rank came late), or went past it."""
        # read before ``at``: see the raise below
        zero = read_progress(self._progress, [0]).get(0) if self._progress is not None else None
        key = self._at(here)
        if store.check([key]):
            number_s, phase = store.get(key).decode().split("|")
            number = int(number_s)
            if phase == "alone" and number not in self._taken:
                if store.compare_set(f"claim/{self.rank}/{nonce}", "", "late") == b"late":
                    return Roll(number=number, everyone=False, late=True)
                return None  # rank 0 claimed this arrival: its answer is on the way
            if phase == "open" or number not in self._taken:
                return None
        if zero is not None and zero.beyond(here):
            # rank 0 was past this point before ``at`` was read, and it marks every place where
            # it convenes before it moves on: it never called the operation here
            raise RuntimeError(f"save_state() was called on rank {self.rank} but rank 0 went on "
                               "without calling it; call it on every rank, or on the main "
                               "process only (if accelerator.is_main_process:)")
        return None

    def outcome(self, roll: Roll) -> tuple[str, str | None]:
        """Another rank, when rank 0 went on alone: wait until it finished.

        Returns:
            (target, None) when it succeeded, ("", its error) when it failed.
        """
        if self._store is None:
            return "", "no store to hear from rank 0"
        key = f"done/{roll.number}"
        delay = _POLL[0]
        start = time.monotonic()
        while not self._store.check([key]):
            if time.monotonic() - start > self.timeout:
                return "", f"rank 0 did not finish within {self.timeout:.0f} s"
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL[1])
        status, _, text = self._store.get(key).decode().partition("|")
        return (text, None) if status == "ok" else ("", text)
