"""NVIDIA CUDA devices, detected through NVML so that detection never initialises CUDA.

Initialising CUDA in a parent process breaks ``fork`` (notebook launchers, DataLoader workers);
``torch.cuda.is_available()`` would create a driver context, NVML does not.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from .. import env
from .base import Device

__all__ = ["CUDADevice", "nvml_device_names"]


def _nvml() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return lib if lib.nvmlInit_v2() == 0 else None


def nvml_device_names() -> list[str]:
    """Names of all physical GPUs as NVML reports them (empty without a driver)."""
    lib = _nvml()
    if lib is None:
        return []
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return []
    names = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(96)
        if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            continue
        if lib.nvmlDeviceGetName(handle, buf, ctypes.c_uint(96)) == 0:
            names.append(buf.value.decode(errors="replace"))
    return names


class CUDADevice(Device):
    kind = "cuda"
    dist_backend = "nccl"

    @classmethod
    def count(cls) -> int:
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return 0  # a CPU build of torch: nothing to probe
        if torch.cuda.is_initialized():
            return torch.cuda.device_count()
        counter = getattr(torch.cuda, "_device_count_nvml", None)
        count = counter() if counter is not None else -1
        if count < 0:
            # NVML unusable (e.g. ROCm or a container without it): ask CUDA after all.
            count = torch.cuda.device_count()
        return max(count, 0)

    @classmethod
    def available(cls) -> bool:
        return cls.count() > 0

    @classmethod
    def names(cls) -> list[str]:
        physical = nvml_device_names()
        visible = env.cuda_visible_devices()
        if visible is not None and all(item.isdigit() for item in visible):
            physical = [physical[int(i)] for i in visible if int(i) < len(physical)]
        return physical[: cls.count()] or ["CUDA GPU"] * cls.count()

    @classmethod
    def free_memory(cls, index: int) -> int | None:
        # mem_get_info initialises CUDA on that GPU: asked only by placement, about to use it
        return int(torch.cuda.mem_get_info(index)[0])

    def torch_device(self, local_rank: int) -> torch.device:
        count = self.count()
        if count == 0:
            raise RuntimeError("CUDA was requested but no GPU is visible to this process")
        if local_rank >= count:
            raise RuntimeError(
                f"local rank {local_rank} needs GPU {local_rank} but only {count} GPU(s) are "
                "visible (CUDA_VISIBLE_DEVICES); start at most one process per GPU on each node"
            )
        return torch.device("cuda", local_rank)

    def bind(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def rng_state(self) -> dict[str, Any] | None:
        return {"cuda": torch.cuda.get_rng_state()}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.cuda.set_rng_state(state["cuda"])

    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed)

    def supports_bf16(self) -> bool:
        return bool(torch.cuda.is_bf16_supported())

    def describe(self, world_size: int) -> str:
        names = self.names()
        label = ", ".join(sorted(set(names))) if names else "GPU"
        return f"{self.count()}x CUDA ({label}), {world_size} process(es), nccl"
