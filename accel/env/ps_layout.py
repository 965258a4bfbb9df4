"""Parameter-server roles: which processes of an ``accel launch --server_num S --worker_num W``
job serve embedding shards and which train.

``accel launch`` exports ``ACCEL_PS_LAYOUT``: ``servers:workers`` per machine, in machine-rank
order (``1:2`` on one machine; ``1:1,1:1`` on two). On each machine the first local ranks are
servers and the rest workers, so every process knows its role, its index among the servers or
among the workers, and the totals, from its torchrun variables alone (no exchange).

The workers form the default process group by themselves (an ``Accelerator`` on a worker sees
``num_processes == W``); ``worker_view`` is what :func:`accel.env.detect_launch` returns there.

Example:
    >>> env = {"ACCEL_PS_LAYOUT": "1:2", "RANK": "2", "LOCAL_RANK": "2",
    ...        "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0"}
    >>> role = ps_role(env)
    >>> (role.role, role.index, role.server_num, role.worker_num, role.rank)
    ('worker', 1, 1, 2, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ._base import LaunchEnvironmentError, current, int_variable

__all__ = ["PS_LAYOUT_VARIABLE", "PsRole", "format_ps_layout", "parse_ps_layout", "ps_role",
           "rank_roles"]

PS_LAYOUT_VARIABLE = "ACCEL_PS_LAYOUT"


def parse_ps_layout(text: str, what: str = PS_LAYOUT_VARIABLE) -> tuple[tuple[int, int], ...]:
    """``"1:2,0:2"`` -> ``((1, 2), (0, 2))``: (servers, workers) per machine.

    Example:
        >>> parse_ps_layout("2:2")
        ((2, 2),)
    """
    machines: list[tuple[int, int]] = []
    for part in text.split(","):
        servers, sep, workers = part.strip().partition(":")
        if not sep or not servers.isdigit() or not workers.isdigit():
            raise LaunchEnvironmentError(
                f"{what}={text!r}: expected servers:workers per machine (e.g. 1:2 or 1:1,1:1); "
                "start parameter-server jobs with accel launch --server_num/--worker_num")
        machines.append((int(servers), int(workers)))
    if sum(s for s, _ in machines) < 1 or sum(w for _, w in machines) < 1:
        raise LaunchEnvironmentError(f"{what}={text!r}: a parameter-server job needs at least "
                                     "one server and one worker")
    return tuple(machines)


def format_ps_layout(machines: tuple[tuple[int, int], ...]) -> str:
    """The inverse of :func:`parse_ps_layout`.

    Example:
        >>> format_ps_layout(((1, 1), (1, 1)))
        '1:1,1:1'
    """
    return ",".join(f"{s}:{w}" for s, w in machines)


@dataclass(frozen=True, kw_only=True, slots=True)
class PsRole:
    """This process's place in a parameter-server job.

    Attributes:
        role: ``"server"`` or ``"worker"``.
        index: position among the servers (or among the workers), machine by machine.
        server_num, worker_num: totals over all machines.
        rank: the torchrun rank (the RPC rank, over servers and workers together).
        world_size: servers + workers.
        local_index, local_count: position among this machine's processes of the same role,
            and their number (a worker's local rank and local world in its process group).
        machine: the machine (torchrun's group rank).
    """

    role: str
    index: int
    server_num: int
    worker_num: int
    rank: int
    world_size: int
    local_index: int
    local_count: int
    machine: int

    @property
    def is_server(self) -> bool:
        return self.role == "server"


def ps_role(environ: Mapping[str, str] | None = None) -> PsRole | None:
    """This process's role, or None outside a parameter-server launch.

    Raises:
        LaunchEnvironmentError: the layout does not match the job torchrun formed.
    """
    env = current(environ)
    raw = env.get(PS_LAYOUT_VARIABLE, "")
    if raw == "":
        return None
    machines = parse_ps_layout(raw)
    rank = int_variable(env, "RANK", minimum=0)
    node = int_variable(env, "GROUP_RANK", minimum=0) if env.get("GROUP_RANK") else 0
    local = int_variable(env, "LOCAL_RANK", minimum=0) if env.get("LOCAL_RANK") else rank
    if node >= len(machines):
        raise LaunchEnvironmentError(f"{PS_LAYOUT_VARIABLE}={raw!r} describes {len(machines)} "
                                     f"machine(s) but this is machine {node}; start every "
                                     "machine with the same --servers/--workers lists")
    servers, workers = machines[node]
    local_world = env.get("LOCAL_WORLD_SIZE")
    if local_world and int(local_world) != servers + workers:
        raise LaunchEnvironmentError(
            f"{PS_LAYOUT_VARIABLE}={raw!r} gives machine {node} {servers} server(s) and "
            f"{workers} worker(s) but torchrun started {local_world} processes there (machines "
            "must form in machine-rank order: use the static rendezvous, the multi-node default)")
    total_s = sum(s for s, _ in machines)
    total_w = sum(w for _, w in machines)
    before_s = sum(s for s, _ in machines[:node])
    before_w = sum(w for _, w in machines[:node])
    if local < servers:
        return PsRole(role="server", index=before_s + local, server_num=total_s, worker_num=total_w,
                      rank=rank, world_size=total_s + total_w, local_index=local,
                      local_count=servers, machine=node)
    return PsRole(role="worker", index=before_w + local - servers, server_num=total_s,
                  worker_num=total_w, rank=rank, world_size=total_s + total_w,
                  local_index=local - servers, local_count=workers, machine=node)


def rank_roles(text: str) -> dict[int, str]:
    """What each torchrun rank of a job with layout ``text`` is, for the launcher's report:
    ``"parameter server i"`` or ``"worker j"`` (ranks run machine by machine, servers first on
    each machine, as :func:`ps_role` numbers them).

    Example:
        >>> rank_roles("1:1,1:1")
        {0: 'parameter server 0', 1: 'worker 0', 2: 'parameter server 1', 3: 'worker 1'}
    """
    roles: dict[int, str] = {}
    for machine, (servers, workers) in enumerate(parse_ps_layout(text)):
        for local in range(servers + workers):  # each rank numbered as it numbers itself
            role = ps_role({PS_LAYOUT_VARIABLE: text, "RANK": str(len(roles)),
                            "GROUP_RANK": str(machine), "LOCAL_RANK": str(local)})
            assert role is not None  # the layout is set
            name = "parameter server" if role.is_server else "worker"
            roles[len(roles)] = f"{name} {role.index}"
    return roles
