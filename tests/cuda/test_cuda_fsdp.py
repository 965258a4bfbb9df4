"""FSDP2 on CUDA (nccl). Skipped with a reason on machines without an NVIDIA GPU (see conftest);
run them on a GPU machine with `python -m pytest -m cuda tests`.

One GPU is enough for a one-process mesh (``ParallelismConfig(dp_shard_size=1)``), which still
runs every CUDA path of the strategy: nccl, the device placement of shards, CPU offload of the
shards (a no-op on CPU runs) and the bf16 policy; two GPUs run the 2-process comparison.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.distributed.test_fsdp import _close, _reference, _train
from tests.spawn import run_workers

pytestmark = pytest.mark.cuda


def _one_gpu_worker(rank: int) -> dict[str, Any]:
    from accel import ParallelismConfig

    warnings.simplefilter("ignore")
    ref, _ = _reference()
    out: dict[str, Any] = {}
    for name, kwargs in {
        "fp32": {},
        "cpu_offload": {"cpu_offload": True},
        "bf16": {"mixed_precision": "bf16"},
    }.items():
        plugin = {"transformer_cls_names_to_wrap": ["Block"],
                  **{k: v for k, v in kwargs.items() if k != "mixed_precision"}}
        full, _, facts = _train("together", parallelism=ParallelismConfig(dp_shard_size=1),
                                mixed_precision=kwargs.get("mixed_precision", "no"),
                                device=None, **plugin)
        out[name] = {"diff": _close(full, ref), "facts": facts}
    return out


def test_fsdp_on_one_gpu_with_offload_and_bf16() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    result = run_workers(_one_gpu_worker, 1, timeout=300)[0]
    assert result["fp32"]["diff"] <= 1e-4, result  # TF32-free fp32 on the GPU vs the CPU
    assert result["cpu_offload"]["diff"] <= 1e-4, result
    assert result["cpu_offload"]["facts"]["shard_device"] == "cpu", result
    assert result["fp32"]["facts"]["shard_device"] == "cuda", result
    assert result["bf16"]["diff"] <= 2e-2, result


def _two_gpu_worker(rank: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    ref, _ = _reference()
    full, _, facts = _train("together", device=None)
    return {"diff": _close(full, ref) if rank == 0 else len(full), "facts": facts}


def test_fsdp_two_gpus_match_one_process() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: NCCL refuses two ranks on one GPU")
    results = run_workers(_two_gpu_worker, 2, timeout=300)
    assert results[0]["diff"] <= 1e-4, results
    assert results[0]["facts"]["units"] == 4
