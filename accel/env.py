"""Who this process is, read from the launcher's environment.

This is the only module of accel that reads ``os.environ`` (``accel/launch`` writes variables for
the children it starts). Every function takes an optional ``environ`` mapping so that tests can
describe a launcher without touching the real environment.

Precedence of launchers: torchrun / ``accel launch`` > MPI (Open MPI, MPICH/Intel MPI, MVAPICH2)
> Slurm. A half-set environment is an error, never "N independent copies of rank 0".

Example:
    >>> info = detect_launch({})
    >>> (info.launcher, info.rank, info.world_size)
    ('none', 0, 1)
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACCEL_VARIABLES",
    "EnvSettings",
    "LaunchEnvironmentError",
    "LaunchInfo",
    "cpu_count",
    "cuda_visible_devices",
    "detect_launch",
    "expand_nodelist",
    "log_level",
    "pjrt_device",
    "read_settings",
]

DEFAULT_PORT = 29500

#: Variables ``accel launch`` sets for its workers, and what they mean. Documented in README.
ACCEL_VARIABLES: dict[str, str] = {
    "ACCEL_DEVICE": "device kind for every worker: cpu | cuda | xla | mps",
    "ACCEL_MIXED_PRECISION": "no | fp16 | bf16",
    "ACCEL_GRADIENT_ACCUMULATION_STEPS": "integer >= 1",
    "ACCEL_DEBUG": "1 to check op/shape/dtype across ranks before every collective",
    "ACCEL_TIMEOUT": "collective timeout in seconds",
    "ACCEL_STALL_SECONDS": "seconds a collective may wait before a stall report is printed",
    "ACCEL_CONFIG_FILE": "path of the YAML config file used by `accel launch` / `accel config`",
    "ACCEL_LAUNCHED": "set to 1 by `accel launch` (informational)",
    "ACCEL_NUM_THREADS": "torch intra-op threads per worker (applied by Accelerator())",
    "ACCEL_LOG_LEVEL": "level for accel.get_logger loggers (DEBUG/INFO/WARNING/ERROR/CRITICAL)",
}


class LaunchEnvironmentError(RuntimeError):
    """The launcher environment is inconsistent (half-set, or missing a rendezvous address)."""


@dataclass(frozen=True)
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

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))


@dataclass(frozen=True)
class EnvSettings:
    """Settings passed to workers by ``accel launch`` through ``ACCEL_*`` variables."""

    device: str | None = None
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    debug: bool = False
    timeout: float | None = None
    stall_seconds: float | None = None
    config_file: str | None = None
    launched: bool = False
    num_threads: int | None = None


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise LaunchEnvironmentError(
            f"environment variable {name}={raw!r} is not an integer; unset it or fix the launcher"
        ) from None


def _opt_int(environ: Mapping[str, str], name: str) -> int | None:
    return _int(environ, name) if environ.get(name, "") != "" else None


def _check(launcher: str, rank: int, world: int, local_rank: int, local_world: int) -> None:
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
    environ: Mapping[str, str], launcher: str, multi_node: bool, default_host: str | None,
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
    port = _opt_int(environ, "MASTER_PORT")
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
    rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    local_rank = _opt_int(environ, "LOCAL_RANK")
    local_world = _opt_int(environ, "LOCAL_WORLD_SIZE")
    local_rank = rank if local_rank is None else local_rank
    local_world = world if local_world is None else local_world
    _check("torchrun", rank, world, local_rank, local_world)
    if world > 1 and "MASTER_ADDR" not in environ:
        raise LaunchEnvironmentError(
            f"RANK/WORLD_SIZE say rank {rank} of {world} but MASTER_ADDR is not set; set "
            "MASTER_ADDR and MASTER_PORT, or start the job with torchrun / `accel launch`"
        )
    addr, port = _rendezvous(environ, "torchrun", False, None, None)
    node = _opt_int(environ, "GROUP_RANK")
    return LaunchInfo(
        "torchrun", rank, local_rank, world, local_world,
        rank // max(local_world, 1) if node is None else node, addr, port,
        use_agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        restart_count=_opt_int(environ, "TORCHELASTIC_RESTART_COUNT") or 0,
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
        rank, world = _int(environ, rank_v), _int(environ, size_v)
        local_rank = _opt_int(environ, lrank_v)
        local_world = _opt_int(environ, lsize_v)
        if local_rank is None or local_world is None:
            # `srun --mpi=pmi2` sets PMI_RANK/PMI_SIZE but no local variables: Slurm knows the
            # node layout. Without either we can only assume one node.
            slurm = _from_slurm(environ)
            if slurm is not None and (slurm.rank, slurm.world_size) == (rank, world):
                return LaunchInfo(name, rank, slurm.local_rank, world, slurm.local_world_size,
                                  slurm.node_rank, slurm.master_addr, slurm.master_port)
            local_rank, local_world = rank, world
        _check(name, rank, world, local_rank, local_world)
        multi = local_world < world
        job_id = next((environ[v] for v in job_vars if environ.get(v)), None)
        addr, port = _rendezvous(environ, name, multi, None, job_id)
        return LaunchInfo(name, rank, local_rank, world, local_world,
                          rank // max(local_world, 1), addr, port)
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
    rank, world = _int(environ, "SLURM_PROCID"), _int(environ, size_v)
    node_id = _opt_int(environ, "SLURM_NODEID") or 0
    local_rank = _opt_int(environ, "SLURM_LOCALID")
    local_world = _slurm_local_world(environ, node_id, world)
    local_rank = rank if local_rank is None else local_rank
    _check("slurm", rank, world, local_rank, local_world)
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or \
        environ.get("SLURM_NODELIST")
    nnodes = _opt_int(environ, "SLURM_STEP_NUM_NODES") or _opt_int(environ, "SLURM_NNODES") or 1
    multi = nnodes > 1 or local_world < world
    # Only expanded when it is needed: an explicit MASTER_ADDR wins over the node list.
    first = expand_nodelist(nodelist)[0] if nodelist and multi and \
        not environ.get("MASTER_ADDR") else None
    job_id = environ.get("SLURM_JOB_ID", "") + "." + environ.get("SLURM_STEP_ID", "")
    addr, port = _rendezvous(environ, "slurm", multi, first if multi else None, job_id)
    return LaunchInfo("slurm", rank, local_rank, world, local_world, node_id, addr, port)


def detect_launch(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """Read this process's rank, world size and rendezvous address from the launcher.

    Raises:
        LaunchEnvironmentError: the environment is half-set or inconsistent.
    """
    env = _env(environ)
    for reader in (_from_torchrun, _from_mpi, _from_slurm):
        info = reader(env)
        if info is not None:
            return info
    port = _opt_int(env, "MASTER_PORT")
    return LaunchInfo("none", 0, 0, 1, 1, 0, env.get("MASTER_ADDR", "127.0.0.1"),
                      port if port is not None else DEFAULT_PORT)


def _float(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise LaunchEnvironmentError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise LaunchEnvironmentError(f"{name}={raw!r} must be > 0")
    return value


def read_settings(environ: Mapping[str, str] | None = None) -> EnvSettings:
    """Read the ``ACCEL_*`` settings that ``accel launch`` passes to its workers."""
    env = _env(environ)
    steps = _opt_int(env, "ACCEL_GRADIENT_ACCUMULATION_STEPS")
    if steps is not None and steps < 1:
        raise LaunchEnvironmentError(
            f"ACCEL_GRADIENT_ACCUMULATION_STEPS={steps} must be >= 1"
        )
    return EnvSettings(
        device=env.get("ACCEL_DEVICE") or None,
        mixed_precision=env.get("ACCEL_MIXED_PRECISION") or None,
        gradient_accumulation_steps=steps,
        debug=env.get("ACCEL_DEBUG", "").lower() in ("1", "true", "yes", "on"),
        timeout=_float(env, "ACCEL_TIMEOUT"),
        stall_seconds=_float(env, "ACCEL_STALL_SECONDS"),
        config_file=env.get("ACCEL_CONFIG_FILE") or None,
        launched=env.get("ACCEL_LAUNCHED", "") == "1",
        num_threads=_positive(env, "ACCEL_NUM_THREADS"),
    )


def _positive(environ: Mapping[str, str], name: str) -> int | None:
    value = _opt_int(environ, name)
    if value is not None and value < 1:
        raise LaunchEnvironmentError(f"{name}={value} must be >= 1")
    return value


def cuda_visible_devices(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (None when unset; [] when set to hide all)."""
    raw = _env(environ).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    items = [item.strip() for item in raw.split(",") if item.strip()]
    # CUDA stops at the first invalid entry; "-1" hides every device.
    out: list[str] = []
    for item in items:
        if item.startswith("-"):
            break
        out.append(item)
    return out


def pjrt_device(environ: Mapping[str, str] | None = None) -> str | None:
    """``PJRT_DEVICE`` (e.g. "CPU", "TPU", "CUDA"), or None when torch_xla is not requested."""
    env = _env(environ)
    value = env.get("PJRT_DEVICE") or env.get("XRT_TPU_CONFIG") and "TPU"
    return value or None


def cpu_count() -> int:
    """CPUs this process may run on (respects affinity masks, e.g. under Slurm or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def log_level(environ: Mapping[str, str] | None = None) -> str | None:
    """``ACCEL_LOG_LEVEL`` (e.g. "INFO", "DEBUG", "20") upper-cased, or None when unset or empty.

    Validation of the value is left to ``accel.logging``, which knows the level names.

    Example:
        >>> log_level({"ACCEL_LOG_LEVEL": "debug"})
        'DEBUG'
    """
    raw = _env(environ).get("ACCEL_LOG_LEVEL", "").strip()
    return raw.upper() or None
