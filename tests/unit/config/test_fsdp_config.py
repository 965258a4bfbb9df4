"""``FullyShardedDataParallelPlugin`` and ``ParallelismConfig``: every accepted spelling (as
Accelerate takes it, FSDP1's mapped to FSDP2's) normalised to one form, and every error."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp import FullStateDictConfig as FSDP1FullStateDictConfig

from accel.config.fsdp import FullyShardedDataParallelPlugin as Plugin
from accel.config.fsdp import parallelism_from_launch, plugin_from_launch


def quiet(**kwargs: Any) -> Plugin:
    """The plugin, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return Plugin(**kwargs)


def test_defaults_are_fsdp2s() -> None:
    p = quiet()
    assert (p.fsdp_version, p.reshard_after_forward, p.hybrid, p.auto_wrap_policy,
            p.transformer_cls_names_to_wrap, p.min_num_params, p.mixed_precision_policy,
            p.cpu_offload, p.activation_checkpointing, p.state_dict_type,
            p.cpu_ram_efficient_loading, p.sync_module_states, p.ignored_modules) == (
        2, True, None, "no_wrap", None, 100_000_000, None, False, False, "SHARDED_STATE_DICT",
        False, True, None)
    assert p.sharded_state
    # the FSDP1-only fields are cleared once read
    assert (p.sharding_strategy, p.backward_prefetch, p.use_orig_params, p.forward_prefetch,
            p.activation_checkpointing_offload) == (None,) * 5


@pytest.mark.parametrize("value,expected", [
    (True, True), (False, False), ("true", True), ("FALSE", False), ("0", False), ("yes", True),
    (" Off ", False)])
def test_reshard_after_forward_booleans(value: Any, expected: bool) -> None:
    p = quiet(reshard_after_forward=value)
    assert (p.reshard_after_forward, p.hybrid) == (expected, None)


@pytest.mark.parametrize("value,reshard,hybrid", [
    ("FULL_SHARD", True, False), ("shard_grad_op", False, False), ("HYBRID_SHARD", True, True),
    ("HYBRID_SHARD_ZERO2", False, True), ("_HYBRID_SHARD_ZERO2", False, True),
    (1, True, False), ("2", False, False), (4, True, True), ("5", False, True),
    (ShardingStrategy.SHARD_GRAD_OP, False, False),
    (ShardingStrategy._HYBRID_SHARD_ZERO2, False, True)])
def test_fsdp1_sharding_strategies_map_to_reshard_and_mesh(value: Any, reshard: bool,
                                                           hybrid: bool) -> None:
    # Accelerate takes a name, torch's enum value 1-5, or the enum; in either field
    for field in ("sharding_strategy", "reshard_after_forward"):
        if field == "reshard_after_forward" and str(value) == "1":
            continue  # "1" there is FSDP2's True (Accelerate's str_to_bool)
        p = quiet(**{field: value})
        assert (p.reshard_after_forward, p.hybrid, p.sharding_strategy) == (reshard, hybrid, None)


def test_sharding_errors() -> None:
    with pytest.raises(ValueError, match="NO_SHARD replicates the whole model.*drop "
                       "fsdp_plugin \\(and --use_fsdp\\) .*dp_replicate_size"):
        Plugin(sharding_strategy="NO_SHARD")
    with pytest.raises(ValueError, match="NO_SHARD"):
        Plugin(sharding_strategy=3)
    with pytest.raises(ValueError, match="sharding_strategy=SHARD_GRAD_OP and "
                       "reshard_after_forward=True disagree; pass only reshard_after_forward"):
        Plugin(sharding_strategy="SHARD_GRAD_OP", reshard_after_forward=True)
    with pytest.raises(ValueError, match="disagree"):
        Plugin(sharding_strategy="FULL_SHARD", reshard_after_forward="SHARD_GRAD_OP")
    with pytest.raises(ValueError, match=r"sharding_strategy='ZERO3' is not an FSDP1 sharding "
                       "strategy; expected one of FULL_SHARD.*or 1-5"):
        Plugin(sharding_strategy="ZERO3")
    with pytest.raises(ValueError, match=r"sharding_strategy=6"):
        Plugin(sharding_strategy=6)
    with pytest.raises(ValueError, match=r"reshard_after_forward='maybe': expected True or "
                       "False \\(or, as FSDP1 spelled it, a sharding strategy"):
        Plugin(reshard_after_forward="maybe")
    # agreeing spellings are fine
    assert quiet(sharding_strategy="SHARD_GRAD_OP",
                 reshard_after_forward="false").reshard_after_forward is False


def test_fsdp_version() -> None:
    assert quiet(fsdp_version="2").fsdp_version == 2
    with pytest.warns(UserWarning, match="fsdp_version=1: accel shards with FSDP2"):
        assert Plugin(fsdp_version=1).fsdp_version == 2
    for bad in (3, "two", True):
        with pytest.raises(ValueError, match="accel runs FSDP2; pass 2"):
            Plugin(fsdp_version=bad)


def test_backward_prefetch() -> None:
    for ok in ("BACKWARD_PRE", "backward_pre", "NO_PREFETCH", 1, "1",
               BackwardPrefetch.BACKWARD_PRE):
        assert quiet(backward_prefetch=ok).backward_prefetch is None
    for post in ("BACKWARD_POST", 2, BackwardPrefetch.BACKWARD_POST):
        with pytest.warns(UserWarning, match="BACKWARD_POST is FSDP1's; FSDP2 always"):
            assert Plugin(backward_prefetch=post).backward_prefetch is None
    with pytest.raises(ValueError, match="backward_prefetch='sideways': expected one of "
                       "BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH"):
        Plugin(backward_prefetch="sideways")


def test_fsdp1_switches() -> None:
    for ok in (True, "true"):
        assert quiet(use_orig_params=ok).use_orig_params is None
    for off in (False, "false"):
        with pytest.warns(UserWarning, match="use_orig_params=False is FSDP1's flat-parameter"):
            Plugin(use_orig_params=off)
    # false spellings of the refused switches are accepted (Accelerate's launcher writes them)
    p = quiet(forward_prefetch="false", activation_checkpointing_offload="False")
    assert (p.forward_prefetch, p.activation_checkpointing_offload) == (None, None)
    refused: dict[str, tuple[Any, str]] = {
        "forward_prefetch": ("true", "FSDP2 has no forward prefetch"),
        "activation_checkpointing_offload": (True, "activation_checkpointing=True"),
        "param_init_fn": (lambda m: None, "cpu_ram_efficient_loading=True"),
        "state_dict_config": (FSDP1FullStateDictConfig(), "use state_dict_type"),
        "optim_state_dict_config": (object(), "use state_dict_type"),
    }
    for name, (value, fix) in refused.items():
        with pytest.raises(ValueError, match=rf"\({name}=...\) has no FSDP2 equivalent in "
                           rf"accel; .*{fix}"):
            Plugin(**{name: value})
    with pytest.raises(ValueError, match=r"forward_prefetch='often'\): expected True or False"):
        Plugin(forward_prefetch="often")


def test_auto_wrap_policy() -> None:
    def policy(module: nn.Module) -> bool:
        return False

    for name in ("TRANSFORMER_BASED_WRAP", "Size_Based_Wrap", " no_wrap "):
        assert quiet(auto_wrap_policy=name).auto_wrap_policy == name.strip().lower()
    assert quiet(auto_wrap_policy=policy).auto_wrap_policy is policy
    p = quiet(transformer_cls_names_to_wrap="Block, Layer,")
    assert (p.auto_wrap_policy, p.transformer_cls_names_to_wrap) == (
        "transformer_based_wrap", ["Block", "Layer"])  # class names imply the policy
    assert quiet(transformer_cls_names_to_wrap=("A",)).transformer_cls_names_to_wrap == ["A"]
    p = quiet(auto_wrap_policy="size_based_wrap", min_num_params="1000")
    assert (p.auto_wrap_policy, p.min_num_params) == ("size_based_wrap", 1000)
    # Accelerate: a minimum of 0 wraps nothing (not every module)
    assert quiet(auto_wrap_policy="size_based_wrap", min_num_params=0).auto_wrap_policy == \
        "no_wrap"
    with pytest.raises(ValueError, match="auto_wrap_policy='layer_wrap': expected one of "
                       "transformer_based_wrap, size_based_wrap, no_wrap"):
        Plugin(auto_wrap_policy="layer_wrap")
    with pytest.raises(TypeError, match="policy name or a callable.*got int"):
        Plugin(auto_wrap_policy=3)  # type: ignore[arg-type]
    for bad in (-1, "1e8", True, 2.5):
        with pytest.raises(ValueError, match="min_num_params must be a non-negative integer"):
            Plugin(min_num_params=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("value,expected", [
    (None, False), (True, True), ("true", True), ("0", False),
    (CPUOffload(offload_params=True), True), (CPUOffload(offload_params=False), False),
    (CPUOffloadPolicy(), True), (OffloadPolicy(), False)])
def test_cpu_offload_spellings(value: Any, expected: bool) -> None:
    assert quiet(cpu_offload=value).cpu_offload is expected


def test_cpu_offload_error() -> None:
    with pytest.raises(ValueError, match=r"cpu_offload='cpu'\): expected True or False"):
        Plugin(cpu_offload="cpu")


def test_state_dict_type() -> None:
    for value, name in ((StateDictType.FULL_STATE_DICT, "FULL_STATE_DICT"),
                        ("full_state_dict", "FULL_STATE_DICT"), ("1", "FULL_STATE_DICT"),
                        (3, "SHARDED_STATE_DICT"), ("SHARDED", "SHARDED_STATE_DICT"),
                        (StateDictType.SHARDED_STATE_DICT, "SHARDED_STATE_DICT")):
        assert quiet(state_dict_type=value).state_dict_type == name
    for bad in ("LOCAL_STATE_DICT", 2, StateDictType.LOCAL_STATE_DICT, "PICKLE"):
        with pytest.raises(ValueError, match="FSDP2 saves FULL_STATE_DICT or SHARDED_STATE_DICT"):
            Plugin(state_dict_type=bad)
    p = quiet(state_dict_type="FULL_STATE_DICT")
    assert not p.sharded_state
    p.set_state_dict_type()  # Accelerate: None keeps the current type
    assert p.state_dict_type == "FULL_STATE_DICT"
    p.set_state_dict_type(StateDictType.SHARDED_STATE_DICT)
    assert (p.state_dict_type, p.sharded_state) == ("SHARDED_STATE_DICT", True)
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT was FSDP1's"):
        p.set_state_dict_type("LOCAL_STATE_DICT")


def test_mixed_precision_policy() -> None:
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    assert quiet(mixed_precision_policy=policy).mixed_precision_policy is policy
    assert quiet(mixed_precision_policy="bf16").mixed_precision_policy == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    assert quiet(mixed_precision_policy="fp32").mixed_precision_policy is None
    got = quiet(mixed_precision_policy={"param_dtype": "bf16", "reduce_dtype": torch.float32,
                                        "cast_forward_inputs": "false"}).mixed_precision_policy
    assert got == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                       cast_forward_inputs=False)
    with pytest.warns(UserWarning, match="buffer_dtype is FSDP1's"):
        Plugin(mixed_precision_policy={"param_dtype": "fp16", "buffer_dtype": "fp16"})
    with pytest.raises(ValueError, match=r"unknown keys \['keep'\]"):
        Plugin(mixed_precision_policy={"keep": 1})
    with pytest.raises(ValueError, match="mixed_precision_policy mode='fp8'"):
        Plugin(mixed_precision_policy="fp8")
    with pytest.raises(TypeError, match="got int"):
        Plugin(mixed_precision_policy=16)
    p = quiet()
    p.set_mixed_precision("fp16")
    assert p.mixed_precision_policy.param_dtype is torch.float16
    p.set_mixed_precision("bf16")  # kept: one is set
    assert p.mixed_precision_policy.param_dtype is torch.float16
    p.set_mixed_precision("bf16", override=True)
    assert p.mixed_precision_policy.param_dtype is torch.bfloat16


def test_switches_and_ignored_modules() -> None:
    p = quiet(activation_checkpointing="yes", cpu_ram_efficient_loading="1",
              sync_module_states="false", ignored_modules=" ")
    assert (p.activation_checkpointing, p.cpu_ram_efficient_loading, p.sync_module_states,
            p.ignored_modules) == (True, True, False, None)
    assert quiet(ignored_modules="head.*").ignored_modules == "head.*"
    for name in ("activation_checkpointing", "cpu_ram_efficient_loading", "sync_module_states"):
        with pytest.raises(ValueError, match=rf"{name}='sometimes'\): expected True or False"):
            Plugin(**{name: "sometimes"})


def test_launch_settings_build_the_plugin_and_blame_the_bad_one() -> None:
    p = plugin_from_launch({"fsdp_version": "2", "fsdp_offload_params": "true",
                            "fsdp_transformer_layer_cls_to_wrap": "Block",
                            "fsdp_min_num_params": "10", "fsdp_ignored_modules": "head"})
    assert (p.cpu_offload, p.auto_wrap_policy, p.transformer_cls_names_to_wrap,
            p.min_num_params, p.ignored_modules) == (True, "transformer_based_wrap", ["Block"],
                                                     10, "head")
    where = {"fsdp_version": "--fsdp_version", "fsdp_state_dict_type": "ACCEL_X",
             "fsdp_sharding_strategy": "a", "fsdp_reshard_after_forward": "b"}.__getitem__
    with pytest.raises(ValueError, match=r"^ACCEL_X 'LOCAL': state_dict_type='LOCAL'"):
        plugin_from_launch({"fsdp_version": "2", "fsdp_state_dict_type": "LOCAL"}, where)
    # a contradiction is blamed on every setting given
    with pytest.raises(ValueError, match=r"^a 'FULL_SHARD', b 'false': sharding_strategy"):
        plugin_from_launch({"fsdp_sharding_strategy": "FULL_SHARD",
                            "fsdp_reshard_after_forward": "false"}, where)
    with pytest.raises(ValueError, match=r"unknown FSDP settings \['fsdp_zero'\]"):
        plugin_from_launch({"fsdp_zero": "3"})
    mesh = parallelism_from_launch({"parallelism_config_dp_replicate_size": 2,
                                    "parallelism_config_tp_size": "1"})
    assert (mesh.dp_replicate_size, mesh.dp_shard_size, mesh.tp_size) == (2, None, 1)
    with pytest.raises(ValueError, match=r"parallelism_config_dp_shard_size 'two': expected a "
                       "positive integer"):
        parallelism_from_launch({"parallelism_config_dp_shard_size": "two"})
    assert parallelism_from_launch({"parallelism_config_cp_size": 2}).cp_size == 2
    with pytest.raises(ValueError, match=r"parallelism_config_cp_size 0: ParallelismConfig"
                       r"\(cp_size=0\) must be a positive int"):
        parallelism_from_launch({"parallelism_config_cp_size": 0})
    with pytest.raises(ValueError, match="unknown parallelism setting"):
        parallelism_from_launch({"parallelism_config_cp_backend": "torch"})


