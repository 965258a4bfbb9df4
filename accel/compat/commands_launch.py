"""Accelerate's launch helpers (``accelerate.commands.launch._validate_launch_command``,
``accelerate.utils.launch.prepare_simple_launcher_cmd_env`` / ``prepare_multi_gpu_env``) over
``accel launch``'s own resolution of the settings.

Each takes the namespace of :func:`accel.commands.launch.launch_command_parser` (``accel
launch``'s flags) or one spelled the way Accelerate's parser spells it (``cpu``,
``training_script``, ``gpu_ids="all"``, ...), resolves it exactly as ``accel launch`` would
(flag > ``ACCEL_*`` environment > config file > default) and answers with what ``accel
launch`` would run: the worker command and the environment the workers get. Nothing is
started. A flag accel refuses (DeepSpeed, Megatron-LM, tensor parallelism, TPU pods) raises.

Example:
    >>> from accel.commands.launch import launch_command_parser
    >>> args = launch_command_parser().parse_args(["--cpu", "-n", "1", "train.py"])
    >>> cmd, env = prepare_simple_launcher_cmd_env(args)
    >>> cmd[-1], env["KMP_BLOCKTIME"]
    ('train.py', '1')
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .commands_config import ClusterConfig

#: ``accel.launch.settings.LaunchSettings`` (launch/ is imported lazily, inside the functions:
#: tests/unit/test_architecture.py).
_Settings = Any

#: ``_validate_launch_command`` is Accelerate's private name, re-exported by
#: ``accel.commands.launch`` only (accel/compat/paths.py).
__all__ = ["prepare_multi_gpu_env", "prepare_simple_launcher_cmd_env"]

#: Accelerate's switches for what accel does not run, and why.
_REFUSED_SWITCHES = {
    "use_deepspeed": "accel has no DeepSpeed integration; drop it to train with DDP",
    "use_megatron_lm": "accel has no Megatron-LM integration; drop it to train with DDP",
    "use_tp": "accel has no tensor parallelism; drop it (FSDP2: --use_fsdp)",
    "tpu_use_cluster": "accel does not start TPU pod workers; run `accel launch --tpu` on "
                       "each TPU VM host",
    "downcast_bf16": "is a TPU-only XLA downcasting switch; use --mixed_precision bf16",
}
_MESH = "parallelism_config_"
#: The attribute that lists what ``_validate_launch_command`` wrote from defaults.
_DEFAULTED = "accel_defaulted"


def _refuse(args: argparse.Namespace) -> None:
    from ..launch.errors import CLIError

    refused = [f"--{name}: {why}" for name, why in _REFUSED_SWITCHES.items()
               if getattr(args, name, False) is True and name not in
               [flag.lstrip("-").replace("-", "_") for flag in
                getattr(args, "refused_flags", None) or []]]
    if refused:
        raise CLIError("; ".join(refused))


def accel_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with Accelerate's spellings turned into ``accel launch``'s flags (the values
    :func:`_validate_launch_command` wrote from defaults are unset again, so that they stay
    defaults).

    Raises:
        ValueError: a switch accel refuses (``use_deepspeed``, ``use_megatron_lm``, ...).
    """
    _refuse(args)
    flags: dict[str, Any] = dict(vars(args))
    for name in flags.pop(_DEFAULTED, None) or ():
        flags[name] = None
    foreign = "refused_flags" not in flags  # not from accel's parser: Accelerate's namespace
    if "device" not in flags:
        flags["device"] = "cpu" if flags.get("cpu") or flags.get("use_cpu") else None
    flags.setdefault("script", flags.get("training_script") or "")
    flags.setdefault("script_args", flags.get("training_script_args") or [])
    if str(flags.get("gpu_ids")).lower() == "all":
        flags["gpu_ids"] = None
    if foreign:
        # Accelerate's parser fills every FSDP and mesh flag with its default: they say
        # something only with --use_fsdp (the mesh sizes only with --use_parallelism_config)
        for name in [key for key in flags if key.startswith(("fsdp_", _MESH))]:
            keep = flags.get("use_fsdp") and (not name.startswith(_MESH) or
                                              flags.get("use_parallelism_config"))
            if not keep or flags[name] is None:
                del flags[name]
    for name in ("config_file", "quiet", "module", "no_python", "refused_flags"):
        flags.setdefault(name, None)
    return argparse.Namespace(**flags)


def _settings(args: argparse.Namespace) -> tuple[_Settings, Any, dict[str, str]]:
    """(``LaunchSettings``, ``ConfigFile`` or None, the workers' environment) of ``args``:
    this process's environment with the workers' variables on top."""
    from ..env._base import current
    from ..launch.cli import resolve_launch

    settings, config, env = resolve_launch(accel_namespace(args))
    return settings, config, {**current(), **env}


def _validate_launch_command(args: argparse.Namespace,
                             ) -> tuple[argparse.Namespace, ClusterConfig | None, bool]:
    """Resolve ``args`` as ``accel launch`` does and write the values back under Accelerate's
    names (``num_processes``, ``mixed_precision``, ``gpu_ids`` ("all" for every GPU),
    ``use_cpu``, ``multi_gpu``, ...).

    Returns:
        ``(args, config, mixed_precision_from_config)``: the config file used, as a
        ``ClusterConfig`` (None without one), and whether it chose the mixed precision.

    Raises:
        ValueError: a refused flag, a bad value, or settings that contradict each other.
    """
    from .commands_config import load_config_from_file

    settings, config, _ = _settings(args)
    cpu = settings.device == "cpu" and settings.explicit("device")
    values: dict[str, Any] = {
        "num_processes": settings.num_processes, "num_machines": settings.num_machines,
        "machine_rank": settings.machine_rank, "main_process_ip": settings.main_process_ip,
        "main_process_port": settings.main_process_port,
        "gpu_ids": settings.gpu_ids or "all", "mixed_precision": settings.mixed_precision,
        "debug": settings.debug, "cpu": cpu, "use_cpu": cpu,
        "num_cpu_threads_per_process": settings.num_cpu_threads_per_process,
        "multi_gpu": settings.device == "cuda" and settings.num_processes > 1,
        "tpu": settings.device == "xla", "use_fsdp": settings.use_fsdp,
        "enable_cpu_affinity": settings.enable_cpu_affinity,
        "dynamo_backend": settings.dynamo.get("dynamo_backend", "no"),
        "training_script": settings.script, "training_script_args": list(settings.script_args),
    }
    for name, value in values.items():
        setattr(args, name, value)
    setattr(args, _DEFAULTED, sorted(name for name in values if name in settings.sources
                                     and not settings.explicit(name)))
    defaults = load_config_from_file(config.path) if config is not None else None
    from_config = settings.sources.get("mixed_precision", "").startswith("config ")
    return args, defaults, from_config


def prepare_simple_launcher_cmd_env(args: argparse.Namespace,
                                    ) -> tuple[list[str], dict[str, str]]:
    """What ``accel launch`` runs for ``args``: the command of a worker (``mpirun ...`` and
    the worker command with ``--mpirun_hostfile``) and the environment it gets (this
    process's, with ``ACCEL_*``, ``OMP_NUM_THREADS`` and, for ``--cpu`` with one process per
    machine, Intel OpenMP's ``KMP_AFFINITY``/``KMP_BLOCKTIME`` on top).

    The worker command (``python -u -m accel.launch.bootstrap script.py ...``) runs the script
    in one process as it is; ``accel launch`` starts it under torchrun's agent.

    Raises:
        ValueError: a refused flag, a bad value, or settings that contradict each other.
    """
    from ..launch.torchrun import worker_command

    settings, _, env = _settings(args)
    if settings.mpirun_hostfile is not None:
        from ..launch.mpirun import mpirun_argv

        return mpirun_argv(settings, env), env
    return worker_command(settings), env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Resolve ``args`` for a torchrun launch and return the workers' environment; torchrun's
    settings are written on ``args`` as Accelerate does: ``nproc_per_node``, and
    ``master_port`` on one machine, or ``nnodes``, ``node_rank`` and ``rdzv_endpoint``
    (``master_addr``/``master_port`` with ``same_network``) on several.

    ``main_process_port`` 0 picks a free port now (as Accelerate does); left unset on one
    machine it stays 0, which ``accel launch`` leaves to torchrun's store to bind.

    Raises:
        ValueError: a refused flag, a bad value, or settings that contradict each other.
    """
    from ..launch.cli import free_port

    if getattr(args, "main_process_port", None) == 0:
        args.main_process_port = free_port()
    settings, _, env = _settings(args)
    port = settings.main_process_port
    args.main_process_port = port
    args.nproc_per_node = str(settings.nproc_per_node)
    if settings.num_machines > 1:
        args.nnodes, args.node_rank = str(settings.num_machines), settings.machine_rank
        if getattr(args, "same_network", False):
            args.master_addr, args.master_port = settings.main_process_ip, str(port)
        else:
            args.rdzv_endpoint = f"{settings.main_process_ip}:{port}"
    else:
        args.master_port = str(port)
    return env
