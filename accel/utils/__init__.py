"""What Hugging Face Accelerate users import from ``accelerate.utils``.

The submodules carry Accelerate's module paths, so ``from accelerate.utils.operations import
gather`` becomes ``from accel.utils.operations import gather``: ``operations`` (collectives on
torch's default process group; with no group they are the world-size-1 no-ops),
``dataclasses`` (configuration objects), ``imports`` (the ``is_*_available`` probes),
``random`` (seeding) and ``other`` (unwrapping models, environment patches, the default config
file).

Example:
    >>> import torch
    >>> from accel.utils import gather, set_seed
    >>> set_seed(0)
    >>> gather(torch.tensor([1, 2])).tolist()
    [1, 2]
"""

from __future__ import annotations

from ..config import parse_mixed_precision
from ..data import skip_first_batches
from ..memory import find_executable_batch_size, release_memory
from ..progress import tqdm
from . import dataclasses, imports, operations, other, random
from .dataclasses import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    LoggerType,
    PrecisionType,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from .imports import (
    is_4bit_bnb_available,
    is_8bit_bnb_available,
    is_aim_available,
    is_amdsmi_available,
    is_bf16_available,
    is_bitsandbytes_multi_backend_available,
    is_bnb_available,
    is_boto3_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_hpu_available,
    is_import_timer_available,
    is_lomo_available,
    is_matplotlib_available,
    is_megatron_lm_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_msamp_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pynvml_available,
    is_pytest_available,
    is_rich_available,
    is_rocm_available,
    is_safetensors_available,
    is_sagemaker_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_tqdm_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_weights_only_available,
    is_xccl_available,
    is_xpu_available,
)
from .operations import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    send_to_device,
    wait_for_everyone,
)
from .other import (
    compile_regions,
    extract_model_from_parallel,
    has_compiled_regions,
    is_compiled_module,
    patch_environment,
    write_basic_config,
)
from .random import (
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)

__all__ = [
    "dataclasses", "imports", "operations", "other", "random", "AutocastKwargs",
    "DDPCommunicationHookType", "DataLoaderConfiguration", "DistributedDataParallelKwargs",
    "DistributedOperationException", "DistributedType", "DynamoBackend", "GradScalerKwargs",
    "GradientAccumulationPlugin", "InitProcessGroupKwargs", "LoggerType", "PrecisionType",
    "ProjectConfiguration", "TorchDynamoPlugin", "broadcast", "broadcast_object_list",
    "compile_regions", "copy_tensor_to_devices", "extract_model_from_parallel",
    "find_executable_batch_size", "gather", "gather_object", "has_compiled_regions",
    "is_4bit_bnb_available", "is_8bit_bnb_available", "is_aim_available", "is_amdsmi_available",
    "is_bf16_available", "is_bitsandbytes_multi_backend_available", "is_bnb_available",
    "is_boto3_available", "is_clearml_available", "is_comet_ml_available", "is_compiled_module",
    "is_cuda_available", "is_datasets_available", "is_deepspeed_available", "is_dvclive_available",
    "is_fp16_available", "is_fp8_available", "is_hpu_available", "is_import_timer_available",
    "is_lomo_available", "is_matplotlib_available", "is_megatron_lm_available",
    "is_mlflow_available", "is_mlu_available", "is_mps_available", "is_msamp_available",
    "is_musa_available", "is_neuron_available", "is_npu_available", "is_pandas_available",
    "is_peft_available", "is_pippy_available", "is_pynvml_available", "is_pytest_available",
    "is_rich_available", "is_rocm_available", "is_safetensors_available", "is_sagemaker_available",
    "is_schedulefree_available", "is_sdaa_available", "is_swanlab_available",
    "is_tensorboard_available", "is_timm_available", "is_torch_xla_available",
    "is_torchao_available", "is_torchdata_available", "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available", "is_tqdm_available", "is_trackio_available",
    "is_transformer_engine_available", "is_transformer_engine_mxfp8_available",
    "is_transformers_available", "is_triton_available", "is_wandb_available",
    "is_weights_only_available", "is_xccl_available", "is_xpu_available", "pad_across_processes",
    "parse_mixed_precision", "patch_environment", "reduce", "release_memory", "send_to_device",
    "set_seed", "skip_first_batches", "synchronize_rng_state", "synchronize_rng_states", "tqdm",
    "wait_for_everyone", "write_basic_config",
]
