"""``accel env``: what accel detects on this machine, for bug reports.

Example:
    >>> "accel" in env_report()  # doctest: +SKIP
    True
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from .errors import CLIError

__all__ = ["env_report", "print_env"]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _devices() -> list[str]:
    import torch

    from ..device import select_device
    from ..device.cuda import CUDADevice
    from ..device.mps import MPSDevice
    from ..device.xla import XLADevice
    from ..env import LaunchEnvironmentError, detect_launch, pjrt_device, read_settings

    count = CUDADevice.count()
    names = ", ".join(CUDADevice.names()) if count else "-"
    lines = [f"torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})",
             f"CUDA GPUs visible: {count} ({names})",
             f"MPS available: {MPSDevice.available()}",
             f"XLA available: {XLADevice.available()} (torch_xla {_version('torch_xla')}, "
             f"PJRT_DEVICE={pjrt_device() or 'unset'})"]
    try:
        info = detect_launch()
        device = select_device(settings=read_settings())
        lines.append(f"launcher: {info.launcher} (rank {info.rank} of {info.world_size}, local "
                     f"rank {info.local_rank} of {info.local_world_size}, rendezvous "
                     f"{info.master_addr}:{info.master_port})")
        lines.append(f"device accel would use: {device.describe(info.world_size)}")
    except (LaunchEnvironmentError, ValueError, RuntimeError) as exc:
        lines.append(f"launcher environment: INVALID: {exc}")
    return lines


def _config_lines() -> list[str]:
    from .config_file import default_config_path, read_config

    path, how = default_config_path()
    if not path.is_file():
        return [f"config file: none ({how}: {path} does not exist)"]
    lines = [f"config file: {path} ({how})"]
    try:
        config = read_config(path)
    except (CLIError, ModuleNotFoundError) as exc:
        return lines + [f"  UNREADABLE: {exc}"]
    lines += [f"  {key}: {value}" for key, value in sorted(config.values.items())]
    if config.ignored:
        lines.append(f"  ignored keys: {', '.join(config.ignored)}")
    return lines


def env_report() -> str:
    """The ``accel env`` text: versions, devices, launcher environment, config file."""
    from .._base.version import __version__
    from ..env import accel_environment, cpu_count

    lines = [f"accel: {__version__}",
             f"Python: {platform.python_version()} ({sys.executable})",
             f"platform: {platform.platform()}",
             f"numpy: {_version('numpy')}, safetensors: {_version('safetensors')}, "
             f"PyYAML: {_version('PyYAML')}",
             f"CPU cores usable: {cpu_count()}"]
    lines += _devices()
    accel_vars = [f"{name}={value}" for name, value in accel_environment().items()]
    lines.append(f"ACCEL_* variables: {', '.join(accel_vars) if accel_vars else 'none set'}")
    lines += _config_lines()
    return "\n".join(f"- {line}" if not line.startswith("  ") else line for line in lines)


def print_env() -> int:
    """Print ``env_report()``; returns 0."""
    print(env_report())
    return 0
