"""Who this process is and what it was asked to do, read from the environment.

``accel.env`` is the only package of accel that reads ``os.environ`` (``accel/launch`` writes
variables for the children it starts, through ``apply`` and ``worker_environment``). Every
reader takes an optional ``environ`` mapping so that tests can describe a launcher without
touching the real environment.

- ``launcher``: rank, world size and rendezvous from torchrun / MPI / Slurm (``detect_launch``);
- ``settings``: the one table of ``ACCEL_*`` variables (``read_settings``, and its inverse);
- ``process``: small typed readers (CUDA_VISIBLE_DEVICES, PJRT_DEVICE, config paths, ...) and
  the worker environment a launcher exports.

Example:
    >>> info = detect_launch({})
    >>> (info.launcher, info.rank, info.world_size)
    ('none', 0, 1)
"""

from __future__ import annotations

from ._base import LaunchEnvironmentError, apply, patched, preserved
from .launcher import DEFAULT_PORT, LaunchInfo, detect_launch, expand_nodelist
from .process import (
    accel_environment,
    agent_environment,
    agent_pid,
    clearml_variables,
    config_file_variable,
    config_home,
    cpu_count,
    cuda_visible_devices,
    error_file,
    formed_layout,
    gloo_socket_ifname,
    log_level,
    mlflow_variables,
    pjrt_device,
    rank_log_dir,
    requested_layout,
    worker_environment,
    worker_ranks,
)
from .ps_layout import PsRole, format_ps_layout, parse_ps_layout, ps_role, rank_roles
from .settings import (
    ACCEL_TABLE,
    ACCEL_VARIABLES,
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    AccelVariable,
    EnvSettings,
    launch_setting_source,
    read_settings,
    settings_environment,
    sync_batchnorm_mode,
)

__all__ = [
    "ACCEL_TABLE",
    "ACCEL_VARIABLES",
    "DEFAULT_PORT",
    "DYNAMO_BACKENDS",
    "DYNAMO_MODES",
    "AccelVariable",
    "EnvSettings",
    "LaunchEnvironmentError",
    "LaunchInfo",
    "PsRole",
    "accel_environment",
    "agent_environment",
    "agent_pid",
    "apply",
    "clearml_variables",
    "config_file_variable",
    "config_home",
    "cpu_count",
    "cuda_visible_devices",
    "detect_launch",
    "error_file",
    "expand_nodelist",
    "formed_layout",
    "gloo_socket_ifname",
    "launch_setting_source",
    "log_level",
    "mlflow_variables",
    "patched",
    "preserved",
    "format_ps_layout",
    "parse_ps_layout",
    "pjrt_device",
    "ps_role",
    "rank_roles",
    "read_settings",
    "rank_log_dir",
    "requested_layout",
    "settings_environment",
    "sync_batchnorm_mode",
    "worker_environment",
    "worker_ranks",
]
