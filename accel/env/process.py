"""Small typed readers of this process's environment, and what ``accel launch`` writes.

The launcher's rank/world variables are read by ``accel.env.launcher`` and the ``ACCEL_*``
settings by ``accel.env.settings``; everything else accel reads from the environment is here,
one function per question, each taking an optional ``environ`` mapping for tests.

Example:
    >>> cuda_visible_devices({"CUDA_VISIBLE_DEVICES": "1,0"})
    ['1', '0']
    >>> env = worker_environment(EnvSettings(device="cpu", num_threads=2), layout=(4, 2))
    >>> env["OMP_NUM_THREADS"], env["ACCEL_NUM_PROCESSES"]
    ('2', '4')
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ._base import current
from .settings import ACCEL_VARIABLES, EnvSettings, settings_environment

__all__ = [
    "accel_environment",
    "agent_environment",
    "agent_pid",
    "config_file_variable",
    "config_home",
    "cpu_count",
    "cuda_visible_devices",
    "error_file",
    "formed_layout",
    "gloo_socket_ifname",
    "log_level",
    "CLEARML_VARIABLES",
    "MLFLOW_VARIABLES",
    "clearml_variables",
    "mlflow_variables",
    "pjrt_device",
    "requested_layout",
    "worker_environment",
    "worker_ranks",
]


def cuda_visible_devices(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (None when unset; [] when set to hide all)."""
    raw = current(environ).get("CUDA_VISIBLE_DEVICES")
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
    env = current(environ)
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
    raw = current(environ).get("ACCEL_LOG_LEVEL", "").strip()
    return raw.upper() or None


def accel_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The documented ``ACCEL_*`` variables that are set, in table order (for ``accel env``)."""
    env = current(environ)
    return {name: env[name] for name in ACCEL_VARIABLES if name in env}


def config_file_variable(environ: Mapping[str, str] | None = None) -> str | None:
    """``ACCEL_CONFIG_FILE``, or None when unset or empty."""
    return current(environ).get("ACCEL_CONFIG_FILE") or None


def config_home(environ: Mapping[str, str] | None = None) -> str | None:
    """``XDG_CONFIG_HOME``, or None when unset or empty."""
    return current(environ).get("XDG_CONFIG_HOME") or None


def gloo_socket_ifname(environ: Mapping[str, str] | None = None) -> str | None:
    """``GLOO_SOCKET_IFNAME`` (the network interface gloo must use), or None when unset/empty."""
    return current(environ).get("GLOO_SOCKET_IFNAME") or None


#: The MLflow variables that take priority over ``MLflowTracker``'s arguments (as in Accelerate).
MLFLOW_VARIABLES = ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS", "MLFLOW_NESTED_RUN")


def mlflow_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``MLFLOW_VARIABLES`` that are set and not empty.

    Example:
        >>> mlflow_variables({"MLFLOW_RUN_ID": "abc", "MLFLOW_TAGS": "", "HOME": "/root"})
        {'MLFLOW_RUN_ID': 'abc'}
    """
    env = current(environ)
    return {name: env[name] for name in MLFLOW_VARIABLES if env.get(name)}


#: The ClearML variables that take priority over ``ClearMLTracker``'s run name (as in Accelerate).
CLEARML_VARIABLES = ("CLEARML_PROJECT", "CLEARML_TASK")


def clearml_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``CLEARML_VARIABLES`` that are set and not empty.

    Example:
        >>> clearml_variables({"CLEARML_PROJECT": "vision", "CLEARML_TASK": ""})
        {'CLEARML_PROJECT': 'vision'}
    """
    env = current(environ)
    return {name: env[name] for name in CLEARML_VARIABLES if env.get(name)}


def error_file(environ: Mapping[str, str] | None = None) -> str | None:
    """torchelastic's ``TORCHELASTIC_ERROR_FILE`` for this worker, or None outside an agent."""
    return current(environ).get("TORCHELASTIC_ERROR_FILE") or None


def worker_ranks(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(RANK, LOCAL_RANK)`` as given, ``"?"`` when unset: labels for messages, never parsed.

    Example:
        >>> worker_ranks({"RANK": "3"})
        ('3', '?')
    """
    env = current(environ)
    return env.get("RANK", "?"), env.get("LOCAL_RANK", "?")


def agent_pid(environ: Mapping[str, str] | None = None) -> int | None:
    """``ACCEL_AGENT_PID``: the pid of the ``accel launch`` agent that started this worker."""
    raw = current(environ).get("ACCEL_AGENT_PID", "")
    return int(raw) if raw.isdigit() else None


def rank_log_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """``ACCEL_RANK_LOG_DIR``: where ``accel launch --log_dir`` wants per-rank log links."""
    return current(environ).get("ACCEL_RANK_LOG_DIR") or None


def requested_layout(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(ACCEL_NUM_PROCESSES, ACCEL_NUM_MACHINES)`` as ``accel launch`` set them, or None."""
    env = current(environ)
    processes, machines = env.get("ACCEL_NUM_PROCESSES"), env.get("ACCEL_NUM_MACHINES")
    return None if processes is None or machines is None else (processes, machines)


def formed_layout(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(WORLD_SIZE, GROUP_WORLD_SIZE)`` of the job torchrun formed, or None."""
    env = current(environ)
    world, machines = env.get("WORLD_SIZE"), env.get("GROUP_WORLD_SIZE")
    return None if world is None or machines is None else (world, machines)


def worker_environment(settings: EnvSettings, *, cuda_visible_devices: str | None = None,
                       layout: tuple[int, int] | None = None,
                       fresh_rdzv_store: bool = False,
                       rank_log_dir: str | None = None) -> dict[str, str]:
    """Variables a launcher exports to its workers (it applies them; nothing is set here).

    Args:
        settings: the ``ACCEL_*`` settings (``num_threads`` also sets ``OMP_NUM_THREADS``).
        cuda_visible_devices: the workers' ``CUDA_VISIBLE_DEVICES`` (None: inherited).
        layout: ``(total processes, machines)`` this launcher was asked for, which the
            bootstrap compares with the world torchrun formed.
        fresh_rdzv_store: a new c10d store per restart of the worker group. The c10d
            rendezvous shares the agent's store with the workers and keeps it across restarts,
            so a restarted worker can read a dead peer's gloo/NCCL address and fail to connect
            (pytorch#135712). Read by the agent.
        rank_log_dir: ``accel launch --log_dir`` (absolute): each worker links its torchrun
            log files there under per-rank names (see ``accel.launch.bootstrap``).
    """
    env = {"ACCEL_LAUNCHED": "1"}
    if layout is not None:
        env["ACCEL_NUM_PROCESSES"], env["ACCEL_NUM_MACHINES"] = map(str, layout)
    if settings.num_threads is not None:
        env["OMP_NUM_THREADS"] = str(settings.num_threads)
    env.update(settings_environment(settings))
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if fresh_rdzv_store:
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if rank_log_dir is not None:
        env["ACCEL_RANK_LOG_DIR"] = rank_log_dir
    return env


def agent_environment(pid: int) -> dict[str, str]:
    """What the launcher's agent process (pid ``pid``) adds for its workers."""
    return {"ACCEL_AGENT_PID": str(pid)}
