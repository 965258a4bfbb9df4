"""``accel launch --use_fsdp --fsdp_* ...`` and Accelerate config files with ``distributed_type:
FSDP``: argv (or the file) -> launch settings -> the workers' ``ACCEL_*`` variables -> the
plugin ``Accelerator()`` builds from them, without starting workers."""

from __future__ import annotations

import io
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

from accel.config.fsdp import FullyShardedDataParallelPlugin, ParallelismConfig
from accel.env import EnvSettings, LaunchEnvironmentError, read_settings
from accel.launch import cli, core, torchrun
from accel.launch.config_file import load_yaml, read_config
from accel.launch.errors import CLIError
from accel.launch.settings import LaunchSettings, settings_table
from accel.launch.torchrun import worker_env
from accel.run.connector import resolve_sharding
from tests.unit.launch.test_cli import run_main, settings

FSDP2_YAML = """\
    compute_environment: LOCAL_MACHINE
    debug: false
    distributed_type: FSDP
    downcast_bf16: 'no'
    enable_cpu_affinity: false
    fsdp_config:
      fsdp_activation_checkpointing: true
      fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
      fsdp_cpu_ram_efficient_loading: true
      fsdp_offload_params: false
      fsdp_reshard_after_forward: false
      fsdp_state_dict_type: FULL_STATE_DICT
      fsdp_transformer_layer_cls_to_wrap: Block,Layer
      fsdp_version: 2
    machine_rank: 0
    main_training_function: main
    mixed_precision: bf16
    num_machines: 1
    num_processes: 4
    parallelism_config:
      parallelism_config_dp_replicate_size: 2
      parallelism_config_dp_shard_size: 2
      parallelism_config_tp_size: 1
      parallelism_config_cp_size: 1
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: false
    """
FSDP2_FLAGS = ["--use_fsdp", "--fsdp_activation_checkpointing", "true",
               "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
               "--fsdp_cpu_ram_efficient_loading", "true", "--fsdp_offload_params", "false",
               "--fsdp_reshard_after_forward", "false", "--fsdp_state_dict_type",
               "FULL_STATE_DICT", "--fsdp_transformer_layer_cls_to_wrap", "Block,Layer",
               "--fsdp_version", "2", "--mixed_precision", "bf16", "-n", "4",
               "--use_parallelism_config", "--parallelism_config_dp_replicate_size", "2",
               "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "1",
               "--parallelism_config_cp_size", "1"]
# What `accelerate config` writes for FSDP1 (sharding strategy in reshard_after_forward)
FSDP1_YAML = """\
    distributed_type: FSDP
    fsdp_config:
      fsdp_auto_wrap_policy: SIZE_BASED_WRAP
      fsdp_backward_prefetch: BACKWARD_PRE
      fsdp_cpu_ram_efficient_loading: false
      fsdp_forward_prefetch: false
      fsdp_min_num_params: 1000
      fsdp_offload_params: true
      fsdp_reshard_after_forward: HYBRID_SHARD_ZERO2
      fsdp_state_dict_type: SHARDED_STATE_DICT
      fsdp_sync_module_states: false
      fsdp_use_orig_params: true
      fsdp_activation_checkpointing: false
      fsdp_version: 1
    num_processes: 2
    use_cpu: true
    """
FSDP1_FLAGS = ["--cpu", "-n", "2", "--use_fsdp", "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP",
               "--fsdp_backward_prefetch", "BACKWARD_PRE", "--fsdp_cpu_ram_efficient_loading",
               "false", "--fsdp_forward_prefetch", "false", "--fsdp_min_num_params", "1000",
               "--fsdp_offload_params", "true", "--fsdp_reshard_after_forward",
               "HYBRID_SHARD_ZERO2", "--fsdp_state_dict_type", "SHARDED_STATE_DICT",
               "--fsdp_sync_module_states", "false", "--fsdp_use_orig_params", "true",
               "--fsdp_activation_checkpointing", "false", "--fsdp_version", "1"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fsdp.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def in_worker(s: LaunchSettings) -> tuple[EnvSettings, dict[str, Any]]:
    """What a worker's Accelerator() resolves from the variables this launch exports."""
    env = read_settings(worker_env(s))
    return env, resolve_sharding(None, None, env)


@pytest.mark.parametrize("yaml_text,flags", [(FSDP2_YAML, FSDP2_FLAGS),
                                             (FSDP1_YAML, FSDP1_FLAGS)], ids=["fsdp2", "fsdp1"])
def test_flags_and_the_accelerate_yaml_give_the_same_plugin_in_the_worker(
        tmp_path: Path, yaml_text: str, flags: list[str]) -> None:
    config = read_config(write(tmp_path, yaml_text))
    assert config.ignored == [] and config.unsupported is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fsdp_version=1's, checked below
        from_file = settings(["t.py"], config=config)
        from_flags = settings([*flags, "t.py"])
        env_file, file_side = in_worker(from_file)
        env_flags, flag_side = in_worker(from_flags)
    assert from_file.use_fsdp and from_flags.use_fsdp and from_file.device == "cpu"
    assert {**worker_env(from_file), "ACCEL_CONFIG_FILE": ""} == {**worker_env(from_flags),
                                                                  "ACCEL_CONFIG_FILE": ""}
    assert env_file.use_fsdp and file_side == flag_side
    plugin, mesh = file_side["fsdp_plugin"], file_side["parallelism_config"]
    assert isinstance(plugin, FullyShardedDataParallelPlugin)
    if "fsdp_version: 2" in yaml_text:
        assert (plugin.reshard_after_forward, plugin.auto_wrap_policy,
                plugin.transformer_cls_names_to_wrap, plugin.activation_checkpointing,
                plugin.cpu_ram_efficient_loading, plugin.state_dict_type, plugin.cpu_offload) == (
            False, "transformer_based_wrap", ["Block", "Layer"], True, True, "FULL_STATE_DICT",
            False)
        assert mesh == ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
        assert worker_env(from_file)["ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
        assert "tp_size" not in str(worker_env(from_file))  # only 1 is accepted; not passed
    else:  # FSDP1's strategy mapped: ZeRO-2 within a node, replicated across nodes
        assert (plugin.reshard_after_forward, plugin.hybrid, plugin.auto_wrap_policy,
                plugin.min_num_params, plugin.cpu_offload, plugin.sync_module_states,
                plugin.state_dict_type) == (False, True, "size_based_wrap", 1000, True, False,
                                            "SHARDED_STATE_DICT")
        assert mesh is None
        assert any("fsdp_version=1" in w for w in from_file.warnings)
        assert from_file.warnings == from_flags.warnings
    assert worker_env(from_file)["ACCEL_USE_FSDP"] == "1"


def test_precedence_flag_env_file_and_the_settings_table(tmp_path: Path) -> None:
    config = read_config(write(tmp_path, FSDP1_YAML))
    env = {"ACCEL_FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "ACCEL_FSDP_MIN_NUM_PARAMS": "5"}
    s = settings(["--fsdp_min_num_params", "7", "t.py"], env, config)
    assert s.warnings == ("fsdp_version=1: accel shards with FSDP2 (fully_shard); the FSDP1 "
                          "settings are mapped to FSDP2's (pass fsdp_version=2 to silence this)",)
    assert (s.fsdp["fsdp_min_num_params"], s.fsdp["fsdp_state_dict_type"],
            s.fsdp["fsdp_offload_params"]) == ("7", "FULL_STATE_DICT", "true")
    assert (s.sources["fsdp_min_num_params"], s.sources["fsdp_state_dict_type"],
            s.sources["fsdp_offload_params"], s.sources["use_fsdp"]) == (
        "flag --fsdp_min_num_params", "env ACCEL_FSDP_STATE_DICT_TYPE", f"config {config.path}",
        f"config {config.path}")
    table = settings_table(s)
    assert "use_fsdp" in table and "fsdp_min_num_params" in table and \
        "flag --fsdp_min_num_params" in table
    assert "fsdp_version" not in settings_table(settings(["--cpu", "-n", "2", "t.py"]))


def test_distributed_type_fsdp_implies_use_fsdp_on_the_detected_device(tmp_path: Path) -> None:
    config = read_config(write(tmp_path, "distributed_type: FSDP\nnum_processes: 2\n"))
    assert config.values == {"num_processes": 2, "use_fsdp": True}
    s = settings(["t.py"], config=config, gpus=2)
    assert (s.use_fsdp, s.device, s.num_processes) == (True, "cuda", 2)
    assert settings(["t.py"], config=config, gpus=0).device == "cpu"  # FSDP2 runs on gloo too
    s = settings(["--cpu", "t.py"], config=config, gpus=2)
    assert (s.use_fsdp, s.device) == (True, "cpu")
    # --multi_gpu chooses DDP over the file's FSDP, as in Accelerate
    s = settings(["--multi_gpu", "t.py"], config=config, gpus=2)
    assert (s.use_fsdp, s.fsdp) == (False, {})
    assert "ACCEL_USE_FSDP" not in worker_env(s)
    # the blocks are used only with distributed_type: FSDP
    other = read_config(write(tmp_path, "distributed_type: MULTI_CPU\nfsdp_config:\n"
                                        "  fsdp_version: 2\nparallelism_config: {}\n"))
    assert other.ignored == ["fsdp_config"] and "use_fsdp" not in other.values
    odd = read_config(write(tmp_path, "distributed_type: FSDP\nfsdp_config:\n  version: 2\n"
                                      "  fsdp_zero: 3\nparallelism_config:\n  dp_shard_size: 2\n"
                                      "  cp_backend: torch\n"))
    assert odd.values["fsdp_version"] == 2 and odd.values["parallelism_config_dp_shard_size"] == 2
    assert odd.ignored == ["fsdp_config.fsdp_zero", "parallelism_config.cp_backend"]


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_a_bad_value_fails_before_any_worker_starts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        how: str) -> None:
    def no_workers(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("workers were started")

    monkeypatch.setattr(torchrun, "run_torchrun", no_workers)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = ["launch", "-q", "--cpu", "-n", "2", "--use_fsdp"]
    if how == "flag":
        args += ["--fsdp_state_dict_type", "LOCAL_STATE_DICT"]
        where = "--fsdp_state_dict_type 'LOCAL_STATE_DICT'"
    elif how == "env":
        monkeypatch.setenv("ACCEL_FSDP_STATE_DICT_TYPE", "LOCAL_STATE_DICT")
        where = "ACCEL_FSDP_STATE_DICT_TYPE 'LOCAL_STATE_DICT'"
    else:
        path = write(tmp_path, "distributed_type: FSDP\nfsdp_config:\n"
                               "  fsdp_state_dict_type: LOCAL_STATE_DICT\n")
        args += ["--config_file", str(path)]
        where = f"fsdp_state_dict_type in {path} 'LOCAL_STATE_DICT'"
    code, err = run_main(capsys, *args, str(script))
    assert code == 2
    assert err == (f"accel launch: error: {where}: state_dict_type='LOCAL_STATE_DICT': FSDP2 "
                   "saves FULL_STATE_DICT or SHARDED_STATE_DICT (LOCAL_STATE_DICT was FSDP1's)\n")


def test_launch_time_refusals_and_warnings() -> None:
    base = ["--cpu", "-n", "2"]
    s = settings([*base, "--fsdp_offload_params", "true", "t.py"])
    assert not s.use_fsdp and s.warnings == (
        "--fsdp_offload_params ignored: FSDP settings apply with --use_fsdp (or "
        "distributed_type: FSDP in the config file)",)
    with pytest.raises(CLIError, match="--parallelism_config_dp_shard_size: the device mesh is "
                       "FSDP's; add --use_fsdp"):
        settings([*base, "--parallelism_config_dp_shard_size", "2", "t.py"])
    with pytest.raises(CLIError, match="FSDP runs on CPU and CUDA devices; on XLA drop "
                       "--use_fsdp"):
        settings(["--tpu", "--use_fsdp", "t.py"])
    # one process runs, as under Accelerate (the script warns once, FSDP2 on a 1-device mesh)
    alone = settings(["--cpu", "--use_fsdp", "t.py"])
    assert alone.use_fsdp and alone.warnings == ()
    one = settings(["--cpu", "--use_fsdp", "--parallelism_config_dp_shard_size", "1", "t.py"])
    assert one.fsdp == {"parallelism_config_dp_shard_size": 1}  # FSDP on one process, asked for
    with pytest.raises(CLIError, match=r"--parallelism_config_dp_replicate_size: "
                       r"ParallelismConfig\(dp_replicate_size=3.*does not fit 4 processes"):
        settings(["--cpu", "-n", "4", "--use_fsdp", "--parallelism_config_dp_replicate_size",
                  "3", "t.py"])
    with pytest.raises(CLIError, match="--parallelism_config_tp_size 2: ParallelismConfig"
                       r"\(tp_size=2\): accel does not apply tensor, context or sequence"):
        settings([*base, "--use_fsdp", "--parallelism_config_tp_size", "2", "t.py"])
    with pytest.raises(CLIError, match="NO_SHARD replicates the whole model"):
        settings([*base, "--use_fsdp", "--fsdp_sharding_strategy", "3", "t.py"])
    with pytest.raises(CLIError, match="activation_checkpointing_offload=...\\) has no FSDP2"):
        settings([*base, "--use_fsdp", "--fsdp_activation_checkpointing_offload", "true",
                  "t.py"])
    s = settings([*base, "--use_fsdp", "--fsdp_backward_prefetch", "BACKWARD_POST", "t.py"])
    assert any("BACKWARD_POST is FSDP1's" in w for w in s.warnings)


def test_context_parallel_flags_stay_refused(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    code, err = run_main(capsys, "launch", "--cpu", "--parallelism_config_cp_backend", "torch",
                         str(script))
    assert code == 2 and "accel has no context or sequence parallelism" in err


def test_the_worker_side() -> None:
    # no ACCEL_USE_FSDP: FSDP variables alone change nothing
    assert resolve_sharding(None, None, read_settings({"ACCEL_FSDP_VERSION": "2"})) == {
        "fsdp_plugin": None, "parallelism_config": None}
    with pytest.raises(LaunchEnvironmentError, match="ACCEL_FSDP_AUTO_WRAP_POLICY 'LAYERS': "
                       "auto_wrap_policy='LAYERS': expected one of.*; fix the `accel launch` "
                       "setting or unset the variable"):
        resolve_sharding(None, None, read_settings({"ACCEL_USE_FSDP": "1",
                                                    "ACCEL_FSDP_AUTO_WRAP_POLICY": "LAYERS"}))
    with pytest.raises(LaunchEnvironmentError, match="ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE"):
        read_settings({"ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE": "0"})
    env = read_settings({"ACCEL_USE_FSDP": "1", "ACCEL_FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
                         "ACCEL_FSDP_OFFLOAD_PARAMS": "true",
                         "ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"})
    mine = FullyShardedDataParallelPlugin(cpu_offload=True)  # reshard_after_forward=True
    with pytest.warns(UserWarning) as caught:
        got = resolve_sharding(mine, ParallelismConfig(dp_shard_size=2), env)
    assert [str(w.message) for w in caught] == [
        "Accelerator(fsdp_plugin=...) overrides ACCEL_FSDP_SHARDING_STRATEGY='SHARD_GRAD_OP' set "
        "by `accel launch`; using the fsdp_plugin given"]
    assert got["fsdp_plugin"] is mine and got["parallelism_config"].dp_shard_size == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # agreeing: silent
        same = FullyShardedDataParallelPlugin(sharding_strategy=2, cpu_offload=True)
        assert resolve_sharding(same, None, env)["fsdp_plugin"] is same
    with pytest.warns(UserWarning, match=r"parallelism_config=...\) overrides "
                      "ACCEL_PARALLELISM_CONFIG_DP_SHARD_SIZE=2"):
        resolve_sharding(same, ParallelismConfig(dp_replicate_size=2), env)


def test_accel_config_writes_an_fsdp_file_that_launch_reads(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "gpu_count", lambda: 0)
    path = tmp_path / "cfg.yaml"
    # 1 machine, CPU, 2 processes, FSDP2: size-based units of 1000 parameters, ZeRO-2, full
    # checkpoints (one invalid policy asked again), no mixed precision
    answers = "1\nyes\n2\nyes\nlayers\nsize_based_wrap\n1000\nno\nfull_state_dict\nno\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    assert cli.main(["config", "--config_file", str(path)]) == 0
    raw = load_yaml(path)
    assert (raw["distributed_type"], raw["fsdp_config"]) == ("FSDP", {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 1000,
        "fsdp_reshard_after_forward": False, "fsdp_state_dict_type": "FULL_STATE_DICT"})
    s = settings(["t.py"], config=read_config(path))
    assert (s.use_fsdp, s.device, s.num_processes) == (True, "cpu", 2)
    plugin = in_worker(s)[1]["fsdp_plugin"]
    assert (plugin.auto_wrap_policy, plugin.min_num_params, plugin.reshard_after_forward,
            plugin.state_dict_type) == ("size_based_wrap", 1000, False, "FULL_STATE_DICT")
    assert "please try again" in capsys.readouterr().out
