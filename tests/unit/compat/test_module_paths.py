"""Accelerate's module paths added for its own test suite: versions, constants, memory, modeling,
parallelism_config (issue 28)."""

from __future__ import annotations

import importlib

import pytest
import torch

from accel.compat.refusals import NotSupportedError


def test_versions_compare_as_versions_and_name_installed_distributions() -> None:
    from accel.utils.versions import compare_versions, is_torch_version

    assert compare_versions("2.10.0", ">", "2.9") and not compare_versions("2.10", "<", "2.9")
    assert compare_versions("torch", "==", torch.__version__.split("+")[0]) or \
        compare_versions("torch", ">=", "2.0")
    assert is_torch_version(">=", "2.0") and not is_torch_version("<", "1.0")
    with pytest.raises(ValueError, match="operation must be one of"):
        compare_versions("1.0", "=>", "1.0")
    import accel.utils

    assert accel.utils.is_torch_version is is_torch_version


@pytest.mark.parametrize(("path", "name", "engine"), [
    ("accel.utils.memory", "find_executable_batch_size", "accel.run.memory"),
    ("accel.utils.memory", "clear_device_cache", "accel.run.memory"),
    ("accel.utils.modeling", "load_checkpoint_in_model", "accel.big_modeling.loading"),
    ("accel.utils.modeling", "infer_auto_device_map", "accel.big_modeling.placement"),
    ("accel.utils.modeling", "set_module_tensor_to_device", "accel.big_modeling.tensors"),
    ("accel.parallelism_config", "ParallelismConfig", "accel.config.fsdp"),
])
def test_the_new_paths_are_the_engine_objects(path: str, name: str, engine: str) -> None:
    assert getattr(importlib.import_module(path), name) is \
        getattr(importlib.import_module(engine), name)


def test_constants_name_shared_behaviour_and_not_checkpoint_files() -> None:
    from accel.utils import constants

    assert "HYBRID_SHARD" in constants.FSDP_SHARDING_STRATEGY
    assert torch.nn.Linear in constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert constants.STR_OPERATION_TO_FUNC[">="](2, 1)
    from accel.utils.constants import SAFE_WEIGHTS_NAME
    with pytest.raises(NotSupportedError, match="accel checkpoints are one"):
        SAFE_WEIGHTS_NAME()


def test_modeling_names_accel_lacks_say_what_to_use() -> None:
    from accel.utils.modeling import get_module_leaves, get_state_dict_from_offload
    with pytest.raises(NotSupportedError, match="infer_auto_device_map"):
        get_module_leaves(torch.nn.Linear(1, 1))
    with pytest.raises(NotSupportedError, match="get_state_dict_offloaded_model"):
        get_state_dict_from_offload(torch.nn.Linear(1, 1), "", {})
