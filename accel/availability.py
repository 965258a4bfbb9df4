"""``is_*_available()``: the probes Accelerate scripts import from ``accelerate.utils``.

Package probes ask :func:`accel._optional.is_available` (the package is found, never imported,
so a probe is cheap and has no side effects); hardware probes ask ``accel.device`` (CUDA is
checked through NVML without initialising it) and ``accel.env`` (``PJRT_DEVICE``).

Example:
    >>> is_tqdm_available(), is_available("no_such_package_here")
    (True, False)
"""

from __future__ import annotations

from . import env
from ._optional import is_available
from .device.cuda import CUDADevice
from .device.mps import MPSDevice

__all__ = [
    "is_aim_available", "is_bf16_available", "is_clearml_available", "is_comet_ml_available",
    "is_cuda_available", "is_datasets_available", "is_dvclive_available",
    "is_matplotlib_available", "is_mlflow_available", "is_mps_available",
    "is_pandas_available", "is_peft_available", "is_rich_available", "is_safetensors_available",
    "is_swanlab_available", "is_tensorboard_available", "is_torch_xla_available",
    "is_torchvision_available", "is_tqdm_available", "is_trackio_available",
    "is_transformers_available", "is_wandb_available",
]


# -- trackers ------------------------------------------------------------------------------------
def is_tensorboard_available() -> bool:
    """``tensorboard`` or ``tensorboardX`` is installed."""
    return is_available("tensorboard") or is_available("tensorboardX")


def is_wandb_available() -> bool:
    return is_available("wandb")


def is_mlflow_available() -> bool:
    """``mlflow`` (or ``mlflow-skinny``, which installs the same module) is installed."""
    return is_available("mlflow")


def is_comet_ml_available() -> bool:
    return is_available("comet_ml")


def is_aim_available() -> bool:
    return is_available("aim")


def is_clearml_available() -> bool:
    return is_available("clearml")


def is_dvclive_available() -> bool:
    return is_available("dvclive")


def is_swanlab_available() -> bool:
    return is_available("swanlab")


def is_trackio_available() -> bool:
    return is_available("trackio")


# -- libraries -----------------------------------------------------------------------------------
def is_datasets_available() -> bool:
    return is_available("datasets")


def is_transformers_available() -> bool:
    return is_available("transformers")


def is_peft_available() -> bool:
    return is_available("peft")


def is_torchvision_available() -> bool:
    return is_available("torchvision")


def is_safetensors_available() -> bool:
    return is_available("safetensors")


def is_tqdm_available() -> bool:
    return is_available("tqdm")


def is_rich_available() -> bool:
    return is_available("rich")


def is_pandas_available() -> bool:
    return is_available("pandas")


def is_matplotlib_available() -> bool:
    return is_available("matplotlib")


# -- hardware ------------------------------------------------------------------------------------
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """``torch_xla`` is installed; with ``check_is_tpu``/``check_is_gpu``, ``PJRT_DEVICE`` also
    names a TPU / a GPU (read from the environment: torch_xla is not imported).
    """
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available(): check_is_tpu and check_is_gpu cannot both "
                         "be True; ask one")
    if not is_available("torch_xla"):
        return False
    pjrt = (env.pjrt_device() or "").upper()
    if check_is_tpu:
        return pjrt == "TPU"
    if check_is_gpu:
        return pjrt in ("GPU", "CUDA")
    return True


def is_cuda_available() -> bool:
    """A CUDA GPU is visible (asked through NVML: CUDA is not initialised)."""
    return CUDADevice.available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Apple's MPS backend can be used (``min_version`` is accepted for Accelerate's signature;
    every torch that accel supports is newer)."""
    return MPSDevice.available()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 works here: on a TPU unless ``ignore_tpu``, on CUDA when the GPU supports it, and
    on the CPU."""
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        return CUDADevice().supports_bf16()
    return True
