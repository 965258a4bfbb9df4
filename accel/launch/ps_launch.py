"""``accel launch`` flags of parameter-server jobs (Paddle ``fleetrun``'s spellings).

``--server_num S --worker_num W`` starts S servers and W workers with one torchrun rendezvous:
S + W processes per job, spread evenly over ``--num_machines`` (each machine gets S/M servers
and W/M workers). ``--servers a,b --workers a,a,b,b`` (fleetrun's lists; a ``:port`` after a
host is accepted and ignored: torchrun and TensorPipe choose their own ports) put one server
per entry of ``--servers`` and one worker per entry of ``--workers`` on the machine named; the
machines are the hosts in order of first appearance, the first one hosts the rendezvous.

The roles reach the processes as ``ACCEL_PS_LAYOUT`` (see :mod:`accel.env.ps_layout`); what is
returned here are ordinary launch flags (process count, machines), so every other launch
setting works as usual.

Example:
    >>> flags, layout, sources = ps_flags({"server_num": 1, "worker_num": 2}, lambda h: False)
    >>> flags["num_processes"], layout, sources["num_processes"]
    (3, '1:2', 'flag --server_num 1 + --worker_num 2')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..env import format_ps_layout
from .errors import CLIError

__all__ = ["PS_FLAGS", "ps_flags"]

#: The flags this module consumes (removed from what ``resolve_settings`` sees).
PS_FLAGS = ("server_num", "worker_num", "servers", "workers")
_SOURCES = "_ps_sources"  # where _set notes which launch settings the ps flags set


def _hosts(text: str, flag: str) -> list[str]:
    hosts = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        host = item.rsplit(":", 1)[0] if item.count(":") == 1 else item.strip("[]")
        hosts.append(host)
    if not hosts:
        raise CLIError(f"{flag} {text!r} lists no host; pass host[:port],... (one entry per "
                       "process)")
    return hosts


def _set(flags: dict[str, Any], *, name: str, value: Any, why: str) -> None:
    given = flags.get(name)
    if given is not None and str(given) != str(value):
        raise CLIError(f"--{name} {given} contradicts {why} (which implies {value}); drop "
                       f"--{name}")
    flags[name] = value
    flags.setdefault(_SOURCES, {})[name] = f"flag {why}"


def _from_counts(flags: dict[str, Any]) -> str:
    servers, workers = flags.get("server_num"), flags.get("worker_num")
    if servers is None or workers is None:
        raise CLIError("a parameter-server job needs both --server_num and --worker_num (e.g. "
                       "--server_num 1 --worker_num 2)")
    machines = int(flags.get("num_machines") or 1)
    if servers % machines or workers % machines:
        raise CLIError(f"--server_num {servers} and --worker_num {workers} must both divide "
                       f"evenly over --num_machines {machines}; or list the hosts with "
                       "--servers/--workers")
    _set(flags, name="num_processes", value=servers + workers,
         why=f"--server_num {servers} + --worker_num "
         f"{workers}")
    return format_ps_layout(((servers // machines, workers // machines),) * machines)


def _from_lists(flags: dict[str, Any], is_local: Callable[[str], bool]) -> str:
    if not flags.get("servers") or not flags.get("workers"):
        raise CLIError("--servers and --workers go together: list the host of every server "
                       "and of every worker")
    servers, workers = _hosts(flags["servers"], "--servers"), _hosts(flags["workers"],
                                                                      "--workers")
    machines = list(dict.fromkeys(servers + workers))
    counts = tuple((servers.count(h), workers.count(h)) for h in machines)
    why = "--servers/--workers"
    for name, value in (("server_num", len(servers)), ("worker_num", len(workers))):
        _set(flags, name=name, value=value, why=why)
    if len({s + w for s, w in counts}) != 1:
        layout = dict(zip(machines, counts, strict=True))
        raise CLIError(f"--servers/--workers give the machines {layout} (servers, workers)"
                       "; torchrun needs the same number of processes on "
                       "every machine: list the hosts so that each runs as many")
    _set(flags, name="num_processes", value=len(servers) + len(workers), why=why)
    if len(machines) > 1:
        _set(flags, name="num_machines", value=len(machines), why=why)
        _set(flags, name="main_process_ip", value=machines[0], why=why)
        if flags.get("machine_rank") is None:
            local = [i for i, host in enumerate(machines) if is_local(host)]
            if len(local) != 1:
                raise CLIError(f"--servers/--workers: {len(local)} of the hosts "
                               f"{','.join(machines)} are this machine; say which with "
                               "--machine_rank")
            _set(flags, name="machine_rank", value=local[0], why=why)
    return format_ps_layout(counts)


def ps_flags(flags: Mapping[str, Any], is_local: Callable[[str], bool]
             ) -> tuple[dict[str, Any], str | None, dict[str, str]]:
    """(launch flags without the ps ones, ``ACCEL_PS_LAYOUT``, the sources of the launch
    settings they set, for the settings table); layout None when no ps flag is given.

    Raises:
        CLIError: counts and lists disagree with each other or with -n / --num_machines.
    """
    out = {k: v for k, v in flags.items() if k not in PS_FLAGS}
    given = {k: flags.get(k) for k in PS_FLAGS if flags.get(k) is not None}
    if not given:
        return out, None, {}
    if flags.get("mpirun_hostfile"):
        raise CLIError("--mpirun_hostfile cannot start a parameter-server job; drop it "
                       "(torchrun's agent starts servers and workers)")
    out.update(given)
    layout = _from_lists(out, is_local) if ("servers" in given or "workers" in given) \
        else _from_counts(out)
    sources = {k: v for k, v in out.pop(_SOURCES, {}).items() if k not in PS_FLAGS}
    return {k: v for k, v in out.items() if k not in PS_FLAGS}, layout, sources
