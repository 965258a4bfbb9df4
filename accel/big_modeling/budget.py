"""Memory budgets per device: ``max_memory`` checked against this machine, or detected.

A budget maps device keys to bytes, in placement order: GPU indices (``0``, ``1``, ... as ints,
the way device maps name GPUs), then ``"xla"`` or ``"mps"``, then ``"cpu"``, then ``"disk"``.
Keys may be written ``0``, ``"0"``, ``"cuda:0"`` or ``torch.device("cuda", 0)``; sizes as
:func:`~accel.big_modeling.sizes.convert_file_size_to_int` reads them.

Example:
    >>> get_max_memory({"cpu": "2GiB", "disk": "100GB"})
    {'cpu': 2147483648, 'disk': 100000000000}
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from ..device import DEVICE_KINDS
from .sizes import convert_file_size_to_int

__all__ = ["DeviceKey", "available_devices", "get_max_memory", "host_memory_available",
           "normalize_device_key"]

#: A device in a budget or a device map: a GPU index, or "xla", "mps", "cpu", "disk".
DeviceKey = int | str
_ORDER = ("xla", "mps", "cpu", "disk")


def _gpu_count() -> int:
    return DEVICE_KINDS["cuda"].count()


def available_devices() -> list[DeviceKey]:
    """The device keys this machine offers, in placement order.

    Example:
        >>> available_devices()[-2:]
        ['cpu', 'disk']
    """
    keys: list[DeviceKey] = list(range(_gpu_count()))
    keys += [kind for kind in ("xla", "mps") if DEVICE_KINDS[kind].available()]
    return [*keys, "cpu", "disk"]


def _parse_key(key: object) -> DeviceKey | None:
    """``key`` as budgets write it (``"cuda:1"`` -> ``1``); None when it names no device kind."""
    if isinstance(key, torch.device):
        key = str(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return key if key >= 0 else None
    if not isinstance(key, str):
        return None
    text = key.strip().lower()
    kind, _, index = text.partition(":")
    if text.isdigit():
        return int(text)
    if kind in ("cuda", "gpu") and index.isdigit():
        return int(index)
    return text if text in _ORDER else None


def normalize_device_key(key: object, devices: list[DeviceKey] | None = None) -> DeviceKey:
    """``key`` as budgets and device maps write it (``"cuda:1"`` -> ``1``), checked to exist.

    Raises:
        ValueError: ``key`` names no device of this machine; the message lists those it has.

    Example:
        >>> normalize_device_key("cpu"), normalize_device_key(" Disk ")
        ('cpu', 'disk')
    """
    devices = available_devices() if devices is None else devices
    found = _parse_key(key)
    if found is None or found not in devices:
        listed = ", ".join(repr(d) for d in devices)
        gpu_hint = (" (no GPU is visible here: CUDA_VISIBLE_DEVICES or the driver)"
                    if not any(isinstance(d, int) for d in devices) else "")
        raise ValueError(f"max_memory/device_map key {key!r} names no device of this machine; "
                         f"its devices are {listed}{gpu_hint}. GPUs are written 0, '0' or "
                         "'cuda:0'")
    return found


def get_max_memory(max_memory: Mapping[object, int | str] | None = None
                   ) -> dict[DeviceKey, int]:
    """Bytes per device, in placement order (Accelerate's name).

    Args:
        max_memory: ``{device: size}`` with sizes as ints or strings (``"10GiB"``). None: what
            this machine has free: each GPU's free memory, then the host's available memory
            (``/proc/meminfo`` MemAvailable, capped by a cgroup limit) under ``"cpu"``, or
            under ``"mps"`` on Apple silicon (shared memory; no separate ``"cpu"`` budget).
            A GPU index this machine does not have is kept, with a logged warning (as in
            Accelerate): a budget may plan a device map for another machine; dispatching a
            model to that GPU here fails.

    Raises:
        ValueError: a key naming no kind of device here (the message lists the devices), the
            same device twice (``0`` and ``"cuda:0"``), or a size that cannot be read.

    Example:
        >>> get_max_memory({"disk": "1TB", "cpu": 1000})
        {'cpu': 1000, 'disk': 1000000000000}
    """
    devices = available_devices()
    if max_memory is None:
        return _detected(devices)
    budget: dict[DeviceKey, int] = {}
    for key, size in max_memory.items():
        device = _parse_key(key)
        if isinstance(device, int) and device not in devices:
            logging.getLogger(__name__).warning(
                "max_memory names GPU %r, which this machine does not have (its devices are "
                "%s); it is kept for planning, but dispatching a model to it here will fail",
                key, ", ".join(repr(d) for d in devices))
        else:
            device = normalize_device_key(key, devices)
        if device in budget:
            raise ValueError(f"max_memory names device {device!r} twice ({key!r} is the "
                             "second spelling); give each device once")
        try:
            budget[device] = convert_file_size_to_int(size)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"max_memory[{key!r}]: {exc}") from None
    gpus = sorted(key for key in budget if isinstance(key, int))
    order = [*gpus, *(key for key in devices if not isinstance(key, int))]
    return {key: budget[key] for key in order if key in budget}


def _detected(devices: list[DeviceKey]) -> dict[DeviceKey, int]:
    budget: dict[DeviceKey, int] = {}
    cuda = DEVICE_KINDS["cuda"]
    for key in devices:
        if isinstance(key, int):
            free = cuda.free_memory(key)
            if free is not None:
                budget[key] = free
    host = host_memory_available()
    budget["mps" if "mps" in devices else "cpu"] = host
    return budget


def host_memory_available() -> int:
    """Bytes of host memory this process may still use: MemAvailable, capped by its cgroup.

    Read from ``/proc/meminfo`` and the cgroup v2 ``memory.max`` (no psutil); elsewhere from
    ``os.sysconf``.

    Example:
        >>> host_memory_available() > 0
        True
    """
    available = _meminfo_available()
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limit = _cgroup_room()
    return min(available, limit) if limit is not None else available


def _meminfo_available() -> int | None:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            return int(rest.split()[0]) * 1024
    return None


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup v2 memory limit; None without a limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            folder = Path("/sys/fs/cgroup") / line[3:].strip().lstrip("/")
            try:
                limit = (folder / "memory.max").read_text().strip()
                used = int((folder / "memory.current").read_text().strip())
            except (OSError, ValueError):
                return None
            return None if limit == "max" else max(int(limit) - used, 0)
    return None
