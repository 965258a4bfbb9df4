"""Accelerate's ``accelerate.utils.constants`` that describe behaviour accel shares.

Checkpoint file names are not here: accel's checkpoint layout is its own (the names are refused
with the reason, see :mod:`accel.compat.refusals`). Version thresholds are Accelerate's, so that
a script gating on them takes the same branch.

Example:
    >>> from accel.utils.constants import FSDP_SHARDING_STRATEGY, TORCH_DYNAMO_MODES
    >>> "FULL_SHARD" in FSDP_SHARDING_STRATEGY, TORCH_DYNAMO_MODES[0]
    (True, 'default')
"""

from __future__ import annotations

import torch

from .versions import STR_OPERATION_TO_FUNC

__all__ = ["BETA_CP_AVAILABLE_PYTORCH_VERSION", "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
           "BETA_TP_AVAILABLE_PYTORCH_VERSION", "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
           "CUDA_DISTRIBUTED_TYPES", "DTENSOR_PYTORCH_VERSION", "FSDP2_PYTORCH_VERSION",
           "FSDP2_STATE_DICT_TYPE", "FSDP_AUTO_WRAP_POLICY", "FSDP_BACKWARD_PREFETCH",
           "FSDP_PYTORCH_VERSION", "FSDP_SHARDING_STRATEGY", "FSDP_STATE_DICT_TYPE",
           "STR_OPERATION_TO_FUNC", "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
           "TORCH_DISTRIBUTED_OPERATION_TYPES", "TORCH_DYNAMO_MODES"]

FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                          "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
FSDP2_STATE_DICT_TYPE = ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
FSDP_PYTORCH_VERSION = "2.1.0"
FSDP2_PYTORCH_VERSION = "2.6.0"
DTENSOR_PYTORCH_VERSION = "2.5.0"
TORCH_DYNAMO_MODES = ["default", "reduce-overhead", "max-autotune"]
BETA_TP_AVAILABLE_PYTORCH_VERSION = "2.3.0"
BETA_TP_AVAILABLE_TRANSFORMERS_VERSION = "4.52.0"
BETA_CP_AVAILABLE_PYTORCH_VERSION = "2.6.0"
BETA_SP_AVAILABLE_DEEPSPEED_VERSION = "0.18.2"
#: distributed types whose processes talk through torch.distributed (Accelerate's names)
CUDA_DISTRIBUTED_TYPES = ["DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP"]
TORCH_DISTRIBUTED_OPERATION_TYPES = [*CUDA_DISTRIBUTED_TYPES, "MULTI_NPU", "MULTI_MLU",
                                     "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU",
                                     "MULTI_HPU", "MULTI_NEURON"]
#: layers whose weights layerwise casting keeps in the storage dtype between uses
SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING = (
    torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d, torch.nn.Linear)
