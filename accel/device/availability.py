"""``is_*_available()``: the probes Accelerate scripts import from ``accelerate.utils``.

Package probes ask :func:`accel._base.optional.is_available` (the package is found, never imported,
so a probe is cheap and has no side effects); hardware probes ask ``accel.device`` (CUDA is
checked through NVML without initialising it) and ``accel.env`` (``PJRT_DEVICE``).

Example:
    >>> is_tqdm_available(), is_available("no_such_package_here")
    (True, False)
"""

from __future__ import annotations

from .. import env
from .._base.optional import is_available
from .cuda import CUDADevice
from .mps import MPSDevice

__all__ = [
    "is_4bit_bnb_available", "is_8bit_bnb_available", "is_aim_available", "is_amdsmi_available",
    "is_bf16_available", "is_bitsandbytes_multi_backend_available", "is_bnb_available",
    "is_boto3_available", "is_clearml_available", "is_comet_ml_available", "is_cuda_available",
    "is_datasets_available", "is_deepspeed_available", "is_dvclive_available",
    "is_fp16_available", "is_fp8_available", "is_hpu_available", "is_import_timer_available",
    "is_lomo_available", "is_matplotlib_available", "is_megatron_lm_available",
    "is_mlflow_available", "is_mlu_available", "is_mps_available", "is_msamp_available",
    "is_musa_available", "is_neuron_available", "is_npu_available", "is_pandas_available",
    "is_peft_available", "is_pippy_available", "is_pynvml_available", "is_pytest_available",
    "is_rich_available", "is_rocm_available", "is_safetensors_available",
    "is_sagemaker_available", "is_schedulefree_available", "is_sdaa_available",
    "is_swanlab_available", "is_tensorboard_available", "is_timm_available",
    "is_torch_xla_available", "is_torchao_available", "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available", "is_torchvision_available", "is_tqdm_available",
    "is_trackio_available", "is_transformer_engine_available",
    "is_transformer_engine_mxfp8_available", "is_transformers_available", "is_triton_available",
    "is_wandb_available", "is_weights_only_available", "is_xccl_available", "is_xpu_available",
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


# -- other libraries (package found, never imported) --------------------------------------------
def is_4bit_bnb_available(*args: object, **kwargs: object) -> bool:
    """``bitsandbytes`` is installed."""
    return is_available("bitsandbytes")


def is_8bit_bnb_available(*args: object, **kwargs: object) -> bool:
    """``bitsandbytes`` is installed."""
    return is_available("bitsandbytes")


def is_amdsmi_available(*args: object, **kwargs: object) -> bool:
    """``amdsmi`` is installed."""
    return is_available("amdsmi")


def is_bitsandbytes_multi_backend_available(*args: object, **kwargs: object) -> bool:
    """``bitsandbytes`` is installed."""
    return is_available("bitsandbytes")


def is_bnb_available(*args: object, **kwargs: object) -> bool:
    """``bitsandbytes`` is installed."""
    return is_available("bitsandbytes")


def is_boto3_available(*args: object, **kwargs: object) -> bool:
    """``boto3`` is installed."""
    return is_available("boto3")


def is_deepspeed_available(*args: object, **kwargs: object) -> bool:
    """``deepspeed`` is installed (accel does not drive DeepSpeed (see README, what differs))."""
    return is_available("deepspeed")


def is_import_timer_available(*args: object, **kwargs: object) -> bool:
    """``import_timer`` is installed."""
    return is_available("import_timer")


def is_lomo_available(*args: object, **kwargs: object) -> bool:
    """``lomo_optim`` is installed."""
    return is_available("lomo_optim")


def is_megatron_lm_available(*args: object, **kwargs: object) -> bool:
    """``megatron`` is installed (accel does not drive Megatron-LM)."""
    return is_available("megatron")


def is_msamp_available(*args: object, **kwargs: object) -> bool:
    """``msamp`` is installed."""
    return is_available("msamp")


def is_pynvml_available(*args: object, **kwargs: object) -> bool:
    """``pynvml`` is installed."""
    return is_available("pynvml")


def is_pytest_available(*args: object, **kwargs: object) -> bool:
    """``pytest`` is installed."""
    return is_available("pytest")


def is_sagemaker_available(*args: object, **kwargs: object) -> bool:
    """``sagemaker`` is installed."""
    return is_available("sagemaker")


def is_schedulefree_available(*args: object, **kwargs: object) -> bool:
    """``schedulefree`` is installed."""
    return is_available("schedulefree")


def is_timm_available(*args: object, **kwargs: object) -> bool:
    """``timm`` is installed."""
    return is_available("timm")


def is_torchao_available(*args: object, **kwargs: object) -> bool:
    """``torchao`` is installed."""
    return is_available("torchao")


def is_torchdata_available(*args: object, **kwargs: object) -> bool:
    """``torchdata`` is installed."""
    return is_available("torchdata")


def is_transformer_engine_available(*args: object, **kwargs: object) -> bool:
    """``transformer_engine`` is installed."""
    return is_available("transformer_engine")


def is_triton_available(*args: object, **kwargs: object) -> bool:
    """``triton`` is installed."""
    return is_available("triton")


def is_torchdata_stateful_dataloader_available() -> bool:
    """torchdata with its ``StatefulDataLoader`` is installed (accel does not need it: its own
    loaders resume exactly; see ``DataLoaderConfiguration(use_stateful_dataloader=True)``)."""
    return is_available("torchdata") and is_available("torchdata.stateful_dataloader")


def is_fp8_available() -> bool:
    """A library that provides fp8 training is installed (accel does not use it)."""
    return any(is_available(m) for m in ("transformer_engine", "torchao", "msamp"))


def is_transformer_engine_mxfp8_available() -> bool:
    """NVIDIA Transformer Engine is installed (accel does not use it)."""
    return is_available("transformer_engine")


def is_fp16_available() -> bool:
    """fp16 mixed precision works here (autocast and the gradient scaler, on every device kind
    accel drives)."""
    return True


def is_weights_only_available() -> bool:
    """``torch.load(weights_only=True)`` exists (every torch accel supports has it)."""
    return True


def is_pippy_available() -> bool:
    """torch's pipelining package is present (accel has no pipeline-parallel front end)."""
    return is_available("torch.distributed.pipelining")


# -- device kinds accel does not drive: the vendor's package is installed -----------------------
def is_hpu_available(*args: object, **kwargs: object) -> bool:
    """The vendor package ``habana_frameworks`` is installed (accel does not drive this device kind;
    it runs on CPU, CUDA, MPS and XLA)."""
    return is_available("habana_frameworks")


def is_mlu_available(*args: object, **kwargs: object) -> bool:
    """The vendor package ``torch_mlu`` is installed (accel does not drive this device kind;
    it runs on CPU, CUDA, MPS and XLA)."""
    return is_available("torch_mlu")


def is_musa_available(*args: object, **kwargs: object) -> bool:
    """The vendor package ``torch_musa`` is installed (accel does not drive this device kind;
    it runs on CPU, CUDA, MPS and XLA)."""
    return is_available("torch_musa")


def is_neuron_available(*args: object, **kwargs: object) -> bool:
    """The vendor package ``torch_neuronx`` is installed (accel does not drive this device kind;
    it runs on CPU, CUDA, MPS and XLA)."""
    return is_available("torch_neuronx")


def is_npu_available(*args: object, **kwargs: object) -> bool:
    """The vendor package ``torch_npu`` is installed (accel does not drive this device kind;
    it runs on CPU, CUDA, MPS and XLA)."""
    return is_available("torch_npu")


def is_sdaa_available(*args: object, **kwargs: object) -> bool:
    """The vendor package ``torch_sdaa`` is installed (accel does not drive this device kind;
    it runs on CPU, CUDA, MPS and XLA)."""
    return is_available("torch_sdaa")


def is_xpu_available(*args: object, **kwargs: object) -> bool:
    """An Intel XPU is visible to torch (accel does not drive XPUs; it runs on CPU, CUDA, MPS
    and XLA)."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def is_xccl_available() -> bool:
    """torch was built with Intel's XCCL collective backend."""
    import torch.distributed as dist

    probe = getattr(dist, "is_xccl_available", None)
    return bool(probe is not None and probe())


def is_rocm_available() -> bool:
    """torch is a ROCm (AMD GPU) build."""
    import torch

    return torch.version.hip is not None
