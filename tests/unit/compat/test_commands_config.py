"""Accelerate's config file classes (``accelerate.commands.config.config_args``) and its
``to-fsdp2`` conversion, over accel's config reader and writer."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest

from accel.commands.config.config_args import BaseConfig, ClusterConfig, load_config_from_file
from accel.commands.to_fsdp2 import (
    convert_config_to_fsdp2,
    to_fsdp2_command,
    to_fsdp2_command_parser,
)


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_classes_take_accelerates_fields_and_fill_empty_blocks() -> None:
    base = BaseConfig(compute_environment="LOCAL_MACHINE", distributed_type="no",
                      mixed_precision="fp16", use_cpu=False, debug=False)
    assert (base.distributed_type, base.mixed_precision) == ("NO", "fp16")
    cluster = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPU",
                            mixed_precision="bf16", use_cpu=False, debug=True, num_processes=4)
    assert (cluster.num_processes, cluster.fsdp_config, cluster.dynamo_config) == (4, {}, {})
    assert cluster.to_dict()["distributed_type"] == "MULTI_GPU"
    assert "fsdp_config" not in cluster.to_dict()  # empty blocks are not written
    with pytest.raises(ValueError, match="distributed_type 'SOMETHING' is not one of"):
        ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="SOMETHING",
                      mixed_precision="no", use_cpu=False, debug=False)
    with pytest.raises(ValueError, match="SageMaker"):
        ClusterConfig(compute_environment="AMAZON_SAGEMAKER", distributed_type="NO",
                      mixed_precision="no", use_cpu=False, debug=False)


def test_yaml_and_json_files_load_save_and_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.yaml", "distributed_type: MULTI_CPU\nnum_processes: 2\n"
                  "mixed_precision: no\nfsdp_config: {}\ndynamo_backend: INDUCTOR\n")
    config = load_config_from_file(path)
    assert isinstance(config, ClusterConfig)
    # filled and moved keys, as Accelerate does; YAML's `no` is the mode "no"
    assert (config.compute_environment, config.use_cpu, config.mixed_precision) == \
        ("LOCAL_MACHINE", False, "no")
    assert config.dynamo_config == {"dynamo_backend": "INDUCTOR"}
    config.to_yaml_file(tmp_path / "out.yaml")
    assert load_config_from_file(str(tmp_path / "out.yaml")) == config
    config.to_json_file(tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text())["num_processes"] == 2
    assert load_config_from_file(str(tmp_path / "out.json")) == config
    single = load_config_from_file(_write(tmp_path / "n.yaml", "distributed_type: NO\n"))
    assert single.num_processes == 1


def test_bad_files_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config_from_file(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match=r"unknown keys \(\['bogus'\]\)"):
        load_config_from_file(_write(tmp_path / "u.yaml", "distributed_type: NO\nbogus: 1\n"))
    with pytest.raises(ValueError, match="needs a `distributed_type`"):
        load_config_from_file(_write(tmp_path / "d.yaml", "num_processes: 2\n"))


def test_fsdp1_settings_become_fsdp2s(caplog: pytest.LogCaptureFixture) -> None:
    config = {"distributed_type": "FSDP", "fsdp_config": {
        "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_use_orig_params": True,
        "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_forward_prefetch": False,
        "fsdp_sync_module_states": True, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_reshard_after_forward": "FULL_SHARD"}}
    with caplog.at_level(logging.WARNING):
        out = convert_config_to_fsdp2(config)
    assert out["fsdp_config"] == {"fsdp_reshard_after_forward": True,
                                  "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                                  "fsdp_version": 2}
    assert "fsdp_use_orig_params has been removed in FSDP2" in caplog.text
    assert "fsdp_forward_prefetch is not implemented in FSDP2" in caplog.text
    already = {"fsdp_config": {"fsdp_version": 2, "fsdp_sharding_strategy": "NO_SHARD"}}
    assert convert_config_to_fsdp2(already) == already  # left alone
    assert convert_config_to_fsdp2({"distributed_type": "NO"}) == {"distributed_type": "NO"}


def test_to_fsdp2_command_writes_the_converted_file(tmp_path: Path) -> None:
    source = _write(tmp_path / "f.yaml", "distributed_type: FSDP\nfsdp_config:\n"
                    "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: false\n")
    parser = to_fsdp2_command_parser()
    out = str(tmp_path / "out.yaml")
    to_fsdp2_command(parser.parse_args(["--config_file", source, "--output-file", out]))
    assert load_config_from_file(out).fsdp_config == {
        "fsdp_reshard_after_forward": True, "fsdp_offload_params": False, "fsdp_version": 2}
    with pytest.raises(FileExistsError, match="--overwrite"):
        to_fsdp2_command(parser.parse_args(["--config_file", source, "--output_file", out]))
    with pytest.raises(ValueError, match="--output_file must be provided"):
        to_fsdp2_command(parser.parse_args(["--config_file", source]))
    with pytest.raises(FileNotFoundError, match="not found"):
        to_fsdp2_command(parser.parse_args(["--config_file", str(tmp_path / "nope.yaml")]))
    to_fsdp2_command(argparse.Namespace(config_file=source, overwrite=True, output_file=None))
    assert load_config_from_file(source).fsdp_config["fsdp_version"] == 2
