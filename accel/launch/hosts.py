"""horovodrun-style host lists for ``accel launch``: ``-H host1:2,host2:2`` and ``--hostfile F``.

A host list names the machines of a job and how many processes ("slots") each may run. It
maps onto accel's multi-machine settings: the machines that get processes, this machine's rank
among them (found by asking which listed address belongs to this machine, as ``--ips`` does),
the rendezvous address (the first host) and the processes to start here. Unlike horovodrun,
accel does not log in to the other hosts: run the same ``accel launch -np N -H ...`` on each
(or use ``mpirun``, which accel's workers understand unchanged).

Horovod's rules for the total (``-np``): it may not exceed the slots of all hosts; a smaller
total fills the hosts in the order listed, so later hosts may get fewer processes or none
(those are left out of the job). Without ``-np`` every slot gets a process (horovodrun
requires ``-np``; accel takes the sum). A host without ``:N`` / ``slots=N`` has one slot, as in
Horovod. Every machine that gets processes must get the same number (accel's node-local
groups, ``local_size()`` and node counts assume it); a placement that does not is refused with
the ``-np`` / slots that would work, where Horovod would run it as a non-homogeneous job.

Hostfile lines (Horovod's and Open MPI's ``host slots=N``, MPICH's ``host:N``, or a bare host;
``#`` starts a comment; blank lines are skipped)::

    10.0.0.1 slots=4   # the first host is where rank 0 and the rendezvous live
    10.0.0.2:4

Example:
    >>> parse_hosts("a:2,b:2,c")
    (Host(name='a', slots=2), Host(name='b', slots=2), Host(name='c', slots=1))
    >>> [(h.name, n) for h, n in assign(parse_hosts("a:2,b:2"), 3)]
    [('a', 2), ('b', 1)]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import CLIError

__all__ = ["Host", "HostLayout", "assign", "host_layout", "parse_hosts", "read_hostfile"]

_SLOTS = re.compile(r"(?<![\w-])slots\s*=\s*(\S+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """One machine of a host list and the processes it may run."""

    name: str
    slots: int


@dataclass(frozen=True, kw_only=True, slots=True)
class HostLayout:
    """What a host list means for this machine.

    Attributes:
        hosts: the machines that get processes, with their process counts, in rank order.
        total: processes over all machines (``-np``).
        machine_rank: this machine's position in ``hosts``.
        source: where the list came from (``flag -H`` or ``hostfile PATH``), for the table.
    """

    hosts: tuple[tuple[Host, int], ...]
    total: int
    machine_rank: int
    source: str

    @property
    def num_machines(self) -> int:
        return len(self.hosts)

    @property
    def local_processes(self) -> int:
        return self.hosts[self.machine_rank][1]

    @property
    def main_host(self) -> str:
        return self.hosts[0][0].name

    def describe(self) -> str:
        """``a:2,b:1``: the processes each machine runs."""
        return ",".join(f"{host.name}:{count}" for host, count in self.hosts)


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise CLIError(f"{where}: slots {text!r} is not a positive whole number; write "
                       "host:N or host slots=N")
    return int(text)


def _host(entry: str, where: str) -> Host:
    """``host``, ``host:N`` or ``[v6addr]:N``."""
    entry = entry.strip()
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        return Host(name=name, slots=_slots(rest[1:], where) if rest.startswith(":") else 1)
    name, sep, count = entry.rpartition(":") if entry.count(":") == 1 else ("", "", entry)
    if not sep:
        return Host(name=entry, slots=1)
    if not name:
        raise CLIError(f"{where}: {entry!r} has no host name before ':'")
    return Host(name=name, slots=_slots(count, where))


def parse_hosts(text: str, where: str = "-H") -> tuple[Host, ...]:
    """Hosts of ``-H``/``--hosts``: ``host1:2,host2:2`` (a host without ``:N`` has 1 slot)."""
    hosts = tuple(_host(item, where) for item in text.split(",") if item.strip())
    if not hosts:
        raise CLIError(f"{where} {text!r} lists no host; write host1:2,host2:2")
    return _unique(hosts, where)


def _unique(hosts: tuple[Host, ...], where: str) -> tuple[Host, ...]:
    seen = [host.name for host in hosts]
    twice = sorted({name for name in seen if seen.count(name) > 1})
    if twice:
        raise CLIError(f"{where} lists {', '.join(twice)} more than once; list each machine "
                       "once with all its slots (host:N)")
    return hosts


def _hostfile_line(line: str, where: str) -> Host:
    """``host``, ``host:N`` or ``host slots=N`` (Open MPI's ``max_slots=`` is not a count)."""
    name, *rest_words = line.split(None, 1)
    host, rest = _host(name, where), " ".join(rest_words)
    match = _SLOTS.search(rest)
    if match is not None:
        return Host(name=host.name, slots=_slots(match.group(1), where))
    if re.search(r"(?<![\w-])slots\b", rest):
        raise CLIError(f"{where}: {line!r} has no number after slots; write host slots=N")
    return host


def read_hostfile(path: str, flag: str = "--hostfile") -> tuple[Host, ...]:
    """Hosts of a hostfile: ``host slots=N`` (Open MPI), ``host:N`` (Hydra) or ``host`` lines,
    ``#`` comments. ``flag`` names the option the file came from, in errors."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise CLIError(f"{flag} {path} cannot be read: {exc.strerror or exc}; pass a file "
                       "with one 'host slots=N' line per machine") from None
    hosts = tuple(_hostfile_line(text, f"{flag} {path} line {number}")
                  for number, line in enumerate(lines, 1)
                  if (text := line.split("#", 1)[0].strip()))
    if not hosts:
        raise CLIError(f"{flag} {path} lists no host; write one 'host slots=N' line per "
                       "machine")
    return _unique(hosts, f"{flag} {path}")


def assign(hosts: Sequence[Host], total: int) -> list[tuple[Host, int]]:
    """Horovod's placement: fill each host's slots in order until ``total`` processes are placed;
    hosts left without a process are dropped."""
    slots = sum(host.slots for host in hosts)
    if total > slots:
        listed = ",".join(f"{host.name}:{host.slots}" for host in hosts)
        raise CLIError(f"-np {total} is more than the {slots} slot(s) of the hosts ({listed}); "
                       f"pass -np {slots} or fewer, or give the hosts more slots")
    placed: list[tuple[Host, int]] = []
    left = total
    for host in hosts:
        if left == 0:
            break
        count = min(host.slots, left)
        placed.append((host, count))
        left -= count
    return placed


def _check_uniform(placed: Sequence[tuple[Host, int]], total: int, source: str) -> None:
    counts = [count for _, count in placed]
    if len(set(counts)) == 1:
        return
    layout = ",".join(f"{host.name}:{count}" for host, count in placed)
    even = min(host.slots for host, _ in placed)
    fits = [n * even for n in range(len(placed), 0, -1)]
    raise CLIError(f"-np {total} with {source} gives the machines different process counts "
                   f"({layout}); accel runs the same number on every machine: pass -np "
                   f"{' or '.join(map(str, fits[:2]))}, or give every host the same slots")


def _this_machine(placed: Sequence[tuple[Host, int]], *, hosts: Sequence[Host], source: str,
                  is_local: Callable[[str], bool], rank: int | None) -> int:
    names = [host.name for host, _ in placed]
    if rank is not None:  # several listed hosts may be this machine (e.g. 127.0.0.x)
        if rank >= len(names):
            raise CLIError(f"--machine_rank {rank}: {source} gives processes to only "
                           f"{len(names)} host(s) ({', '.join(names)})")
        if not is_local(names[rank]):
            raise CLIError(f"--machine_rank {rank} names {names[rank]} ({source}), which is not "
                           "this machine; drop --machine_rank (it is found from the addresses)")
        return rank
    local = [index for index, name in enumerate(names) if is_local(name)]
    if local:
        return local[0]
    idle = [host.name for host in hosts[len(placed):] if is_local(host.name)]
    if idle:
        raise CLIError(f"this machine ({idle[0]}) gets no process from {source} with -np "
                       f"{sum(n for _, n in placed)}; start accel launch only on "
                       f"{', '.join(names)}, or raise -np")
    raise CLIError(f"{source}: none of {', '.join(names)} is this machine; list this machine's "
                   "name or address (as the other machines reach it)")


def host_layout(hosts: Sequence[Host], *, total: int | None, source: str,
                is_local: Callable[[str], bool], machine_rank: int | None = None) -> HostLayout:
    """Place ``total`` processes (None: one per slot) on ``hosts`` and find this machine.

    Example:
        >>> layout = host_layout(parse_hosts("n1:2,n2:2"), total=None, source="flag -H",
        ...                      is_local=lambda h: h == "n2")
        >>> layout.machine_rank, layout.local_processes, layout.main_host, layout.total
        (1, 2, 'n1', 4)
    """
    count = sum(host.slots for host in hosts) if total is None else total
    placed = assign(hosts, count)
    where = source.replace("flag ", "").replace("hostfile ", "--hostfile ")  # as typed
    _check_uniform(placed, count, where)
    rank = _this_machine(placed, hosts=hosts, source=where, is_local=is_local, rank=machine_rank)
    return HostLayout(hosts=tuple(placed), total=count, machine_rank=rank, source=source)
