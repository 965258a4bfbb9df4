"""Who this process is, read from the launcher's environment.

Precedence of launchers: torchrun / ``accel launch`` > MPI (Open MPI, MPICH/Intel MPI, MVAPICH2)
> Slurm. A half-set environment is an error, never "N independent copies of rank 0".

Example:
    >>> info = detect_launch({})
    >>> (info.launcher, info.rank, info.world_size)
    ('none', 0, 1)
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ._base import LaunchEnvironmentError, current, int_variable, optional_int
from .ps_layout import ps_role

__all__ = ["DEFAULT_PORT", "LaunchInfo", "detect_launch", "expand_nodelist"]

DEFAULT_PORT = 29500


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchInfo:
    """What the launcher told this process about its place in the job."""

    launcher: str  # "none" | "torchrun" | "openmpi" | "mpich" | "mvapich2" | "slurm"
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    #: torchrun's agent hosts the c10d store; workers must connect to it rather than host one.
    use_agent_store: bool = False
    restart_count: int = 0
    #: torchrun's rendezvous id (``TORCHELASTIC_RUN_ID``): the same on every attempt of one job.
    run_id: str | None = None

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))


def _check(launcher: str, *, rank: int, world: int, local_rank: int, local_world: int) -> None:
    if world < 1:
        raise LaunchEnvironmentError(f"{launcher}: world size is {world}; it must be >= 1")
    if not 0 <= rank < world:
        raise LaunchEnvironmentError(
            f"{launcher}: rank {rank} is outside world size {world}; expected 0 <= rank < world "
            "size. Check the launcher variables (a stale RANK/WORLD_SIZE exported in your shell?)"
        )
    if not 0 <= local_rank < max(local_world, 1):
        raise LaunchEnvironmentError(
            f"{launcher}: local rank {local_rank} is outside local world size {local_world}"
        )
    if local_world > world:
        raise LaunchEnvironmentError(
            f"{launcher}: local world size {local_world} is larger than world size {world}; "
            "check the launcher variables (a stale LOCAL_WORLD_SIZE exported in your shell?)"
        )


def _port_from_job_id(job_id: str | None) -> int:
    """A port every rank of one job derives identically, different for different jobs."""
    if not job_id:
        return DEFAULT_PORT
    return 20000 + zlib.crc32(job_id.encode()) % 20000


def _rendezvous(
    environ: Mapping[str, str], *, launcher: str, multi_node: bool, default_host: str | None,
    job_id: str | None,
) -> tuple[str, int]:
    addr = environ.get("MASTER_ADDR") or default_host
    if addr is None:
        if multi_node:
            raise LaunchEnvironmentError(
                f"{launcher} started a multi-node job but MASTER_ADDR is not set; export "
                "MASTER_ADDR=<address of the rank-0 node> (and MASTER_PORT) for every rank, "
                "e.g. `mpirun -x MASTER_ADDR=10.0.0.1 -x MASTER_PORT=29500 ...`"
            )
        addr = "127.0.0.1"
    port = optional_int(environ, "MASTER_PORT")
    return addr, port if port is not None else _port_from_job_id(job_id)


def _from_torchrun(environ: Mapping[str, str]) -> LaunchInfo | None:
    has_rank, has_world = "RANK" in environ, "WORLD_SIZE" in environ
    if not has_rank and not has_world:
        if "LOCAL_RANK" in environ:
            raise LaunchEnvironmentError(
                "LOCAL_RANK is set but RANK and WORLD_SIZE are not; start the job with torchrun "
                "or `accel launch`, or unset LOCAL_RANK"
            )
        return None
    if has_rank != has_world:
        found, missing = ("RANK", "WORLD_SIZE") if has_rank else ("WORLD_SIZE", "RANK")
        raise LaunchEnvironmentError(
            f"{found} is set but {missing} is not: a half-set launcher environment. Start the job "
            f"with torchrun or `accel launch`, or set both (or neither)."
        )
    rank, world = int_variable(environ, "RANK"), int_variable(environ, "WORLD_SIZE")
    local_rank = optional_int(environ, "LOCAL_RANK")
    local_world = optional_int(environ, "LOCAL_WORLD_SIZE")
    local_rank = rank if local_rank is None else local_rank
    local_world = world if local_world is None else local_world
    _check("torchrun", rank=rank, world=world, local_rank=local_rank, local_world=local_world)
    if world > 1 and "MASTER_ADDR" not in environ:
        raise LaunchEnvironmentError(
            f"RANK/WORLD_SIZE say rank {rank} of {world} but MASTER_ADDR is not set; set "
            "MASTER_ADDR and MASTER_PORT, or start the job with torchrun / `accel launch`"
        )
    addr, port = _rendezvous(environ, launcher="torchrun", multi_node=False, default_host=None,
                             job_id=None)
    node = optional_int(environ, "GROUP_RANK")
    return LaunchInfo(
        launcher="torchrun", rank=rank, local_rank=local_rank, world_size=world,
        local_world_size=local_world,
        node_rank=rank // max(local_world, 1) if node is None else node, master_addr=addr,
        master_port=port,
        use_agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        restart_count=optional_int(environ, "TORCHELASTIC_RESTART_COUNT") or 0,
        run_id=environ.get("TORCHELASTIC_RUN_ID") or None,
    )


# (launcher, rank, size, local rank, local size, job id variables)
_MPI_FLAVOURS = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")),
    ("mvapich2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE", ("MPIRUN_ID",)),
    # PMI_ID is per process (a rank), so it cannot name the job: every rank must derive one port.
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
     ("PMI_JOBID", "I_MPI_HYDRA_UUID", "PMI_KVSNAME")),
)


def _from_mpi(environ: Mapping[str, str]) -> LaunchInfo | None:
    for name, rank_v, size_v, lrank_v, lsize_v, job_vars in _MPI_FLAVOURS:
        if rank_v not in environ and size_v not in environ:
            continue
        if rank_v not in environ or size_v not in environ:
            raise LaunchEnvironmentError(
                f"{name}: only one of {rank_v} and {size_v} is set; start the job with mpirun "
                "or unset the stale variable"
            )
        rank, world = int_variable(environ, rank_v), int_variable(environ, size_v)
        local_rank = optional_int(environ, lrank_v)
        local_world = optional_int(environ, lsize_v)
        if local_rank is None or local_world is None:
            # `srun --mpi=pmi2` sets PMI_RANK/PMI_SIZE but no local variables: Slurm knows the
            # node layout. Without either we can only assume one node.
            slurm = _from_slurm(environ)
            if slurm is not None and (slurm.rank, slurm.world_size) == (rank, world):
                return LaunchInfo(launcher=name, rank=rank, local_rank=slurm.local_rank,
                                  world_size=world, local_world_size=slurm.local_world_size,
                                  node_rank=slurm.node_rank, master_addr=slurm.master_addr,
                                  master_port=slurm.master_port)
            local_rank, local_world = rank, world
        _check(name, rank=rank, world=world, local_rank=local_rank, local_world=local_world)
        multi = local_world < world
        job_id = next((environ[v] for v in job_vars if environ.get(v)), None)
        addr, port = _rendezvous(environ, launcher=name, multi_node=multi, default_host=None,
                                 job_id=job_id)
        return LaunchInfo(launcher=name, rank=rank, local_rank=local_rank, world_size=world,
                          local_world_size=local_world, node_rank=rank // max(local_world, 1),
                          master_addr=addr, master_port=port)
    return None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm node list such as ``node[01-03,7],gpu-a`` into host names.

    Example:
        >>> expand_nodelist("n[1-3],m")
        ['n1', 'n2', 'n3', 'm']
    """
    hosts: list[str] = []
    for part in _split_top_level(nodelist):
        hosts.extend(_expand_host(part))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1,2],b`` -> ``['a[1,2]', 'b']``."""
    parts: list[str] = []
    depth = start = 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _expand_host(pattern: str) -> list[str]:
    """Expand every bracket group of one host pattern, e.g. ``r[1-2]-n[01,03]`` (4 hosts)."""
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)", pattern)
    if not match:
        return [pattern]
    prefix, ranges, rest = match.groups()
    values: list[str] = []
    for item in ranges.split(","):
        lo, _, hi = item.strip().partition("-")
        if not (lo.isdigit() and (not hi or hi.isdigit())):
            raise LaunchEnvironmentError(
                f"cannot expand Slurm node list entry {pattern!r}: {item!r} is not a number or a "
                "range like 01-04; set MASTER_ADDR to the rank-0 host instead"
            )
        width = len(lo)
        values.extend(f"{v:0{width}d}" for v in range(int(lo), int(hi or lo) + 1))
    tails = _expand_host(rest)
    return [f"{prefix}{value}{tail}" for value in values for tail in tails]


def _slurm_local_world(environ: Mapping[str, str], node_id: int, world: int) -> int:
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return world
    counts: list[int] = []
    for item in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not match:
            return world
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[node_id] if node_id < len(counts) else counts[-1]


def _from_slurm(environ: Mapping[str, str]) -> LaunchInfo | None:
    if "SLURM_PROCID" not in environ:
        return None
    size_v = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    if size_v not in environ:
        raise LaunchEnvironmentError(
            "slurm: SLURM_PROCID is set but SLURM_NTASKS is not; start the job with srun"
        )
    rank, world = int_variable(environ, "SLURM_PROCID"), int_variable(environ, size_v)
    node_id = optional_int(environ, "SLURM_NODEID") or 0
    local_rank = optional_int(environ, "SLURM_LOCALID")
    local_world = _slurm_local_world(environ, node_id, world)
    local_rank = rank if local_rank is None else local_rank
    _check("slurm", rank=rank, world=world, local_rank=local_rank, local_world=local_world)
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or \
        environ.get("SLURM_NODELIST")
    nnodes = optional_int(environ, "SLURM_STEP_NUM_NODES") or \
        optional_int(environ, "SLURM_NNODES") or 1
    multi = nnodes > 1 or local_world < world
    # Only expanded when it is needed: an explicit MASTER_ADDR wins over the node list.
    first = expand_nodelist(nodelist)[0] if nodelist and multi and \
        not environ.get("MASTER_ADDR") else None
    job_id = environ.get("SLURM_JOB_ID", "") + "." + environ.get("SLURM_STEP_ID", "")
    addr, port = _rendezvous(environ, launcher="slurm", multi_node=multi,
                             default_host=first if multi else None, job_id=job_id)
    return LaunchInfo(launcher="slurm", rank=rank, local_rank=local_rank, world_size=world,
                      local_world_size=local_world, node_rank=node_id, master_addr=addr,
                      master_port=port)


def _ps_view(info: LaunchInfo, environ: Mapping[str, str]) -> LaunchInfo:
    """In a parameter-server job (``accel launch --server_num``) the workers alone form the
    process group (rank = worker index, world = workers) and a server is a process of its own;
    the RPC layer (``accel.ps``) spans both with the torchrun ranks."""
    role = ps_role(environ)
    if role is None:
        return info
    if role.is_server:
        return LaunchInfo(launcher="none", rank=0, local_rank=0, world_size=1, local_world_size=1,
                          node_rank=0, master_addr=info.master_addr, master_port=info.master_port)
    return replace(info, rank=role.index, world_size=role.worker_num,
                   local_rank=role.local_index, local_world_size=role.local_count)


def detect_launch(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read this process's rank, world size and rendezvous address from the launcher.

    Raises:
        LaunchEnvironmentError: the environment is half-set or inconsistent.
    """
    env = current(environ)
    for reader in (_from_torchrun, _from_mpi, _from_slurm):
        info = reader(env)
        if info is not None:
            return _ps_view(info, env) if info.launcher == "torchrun" else info
    port = optional_int(env, "MASTER_PORT")
    return LaunchInfo(launcher="none", rank=0, local_rank=0, world_size=1, local_world_size=1,
                      node_rank=0, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                      master_port=port if port is not None else DEFAULT_PORT)
