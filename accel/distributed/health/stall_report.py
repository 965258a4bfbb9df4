"""What a stall report says: every rank's published position, folded into a few lines.

Pure functions (no torch, no store) so that the wording is unit-tested.

Example:
    >>> me = Position(rank=0, seq=3, op="barrier", site="train.py:20", wall=100.0)
    >>> other = Position(rank=1, seq=2, op="gather", site="train.py:15", wall=99.0)
    >>> text = format_stall_report(me, positions=[me, other], now=102.0, timeout=10.0,
    ...                            threshold=2.0)
    >>> "rank 1" in text and "not in a collective since #2 gather at train.py:15" in text
    True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Position", "format_stall_report", "rank_ranges"]

_RULE = "=" * 72


@dataclass(frozen=True, kw_only=True, slots=True)
class Position:
    """A rank's last sync point: sequence number, op, call site and wall-clock entry time."""

    rank: int
    seq: int
    op: str
    site: str
    wall: float

    def encode(self) -> str:
        return f"{self.seq}|{self.wall:.3f}|{self.op}|{self.site}"

    @classmethod
    def decode(cls, rank: int, raw: bytes | str) -> Position:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        seq, wall, op, site = (text.split("|", 3) + ["", "", "", ""])[:4]
        try:
            return cls(rank=rank, seq=int(seq), op=op, site=site, wall=float(wall))
        except ValueError:
            return cls(rank=rank, seq=-1, op="?", site=text[:200], wall=0.0)


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2,5"`` (``"rank 3"`` for one)."""
    ordered = sorted(ranks)
    parts: list[str] = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ",".join(parts)


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    if not path:
        return site
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        rel = path
    return f"{rel if len(rel) < len(path) and not rel.startswith('..') else path}:{line}"


def _describe(pos: Position | None, me: Position, now: float) -> tuple[str, str]:
    """(grouping key, text) for one rank relative to the stalled collective ``me``."""
    if pos is None or pos.seq < 0:
        return "none", "no position published (not started, or not using accel collectives)"
    age = max(0.0, now - pos.wall)
    where = f"#{pos.seq} {pos.op} at {_short(pos.site)}"
    if pos.seq == me.seq and (pos.op, pos.site) == (me.op, me.site):
        return f"in {where}", f"waiting in {where} (for {age:.1f} s)"
    if pos.seq == me.seq:
        return f"in {where}", f"waiting in {where} - a DIFFERENT collective (for {age:.1f} s)"
    if pos.seq > me.seq:
        return f"ahead {where}", f"ahead, in {where} (entered {age:.1f} s ago)"
    if pos.seq == 0:
        return f"since {where}", (f"not in a collective; none since start-up at "
                                  f"{_short(pos.site)} ({age:.1f} s ago)")
    return f"since {where}", f"not in a collective since {where} ({age:.1f} s ago)"


def _summary(me: Position, positions: Sequence[Position | None]) -> str:
    """Who arrived at the stalled sync point, in which collective; who is elsewhere."""
    calls: dict[tuple[str, str], list[int]] = {}
    for p in positions:
        if p is not None and p.seq == me.seq:
            calls.setdefault((p.op, p.site), []).append(p.rank)
    arrived = {rank for ranks in calls.values() for rank in ranks}
    missing = [r for r in range(len(positions)) if r not in arrived]
    parts = [f"{rank_ranges(ranks)} in {op} at {_short(site)}"
             for (op, site), ranks in sorted(calls.items(), key=lambda kv: min(kv[1]))]
    head = f"at #{me.seq}: " if len(calls) == 1 else \
        f"MISMATCH at #{me.seq}, ranks are in {len(calls)} different collectives: "
    tail = f"; not there: {rank_ranges(missing)} of {len(positions)}" if missing else \
        f" (all {len(positions)} ranks arrived)"
    return head + "; ".join(parts) + tail


def format_stall_report(me: Position, *, positions: Sequence[Position | None], now: float,
                        timeout: float | None, threshold: float) -> str:
    """The stall report printed once per stalled collective (rank lines folded by state)."""
    groups: dict[str, tuple[list[int], str]] = {}
    for rank, pos in enumerate(positions):
        key, text = _describe(pos, me, now)
        groups.setdefault(key, ([], text))[0].append(rank)
    width = max(len(rank_ranges(r)) for r, _ in groups.values())
    waited = max(0.0, now - me.wall)
    limit = f"the collective timeout ({timeout:.0f} s) ends the job if nothing changes" \
        if timeout else "no collective timeout is set"
    lines = [_RULE,
             f"accel STALL REPORT: rank {me.rank} has waited {waited:.1f} s in collective "
             f"#{me.seq} {me.op} at {_short(me.site)}",
             f"(threshold {threshold:g} s, ACCEL_STALL_SECONDS; {limit})", "-" * len(_RULE)]
    for ranks, text in sorted(groups.values(), key=lambda item: min(item[0])):
        lines.append(f"  {rank_ranges(ranks):<{width}}  {text}")
    lines.append(_summary(me, positions))
    lines += ["Every rank must call the same collectives in the same order: a collective called "
              "on only some",
              "ranks (e.g. under `if accelerator.is_main_process:`) or different collectives on "
              "different ranks",
              "wait until the timeout. ACCEL_DEBUG=1 checks op, shapes and dtypes before every "
              "collective.", _RULE]
    return "\n".join(lines)
