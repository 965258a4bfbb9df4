"""Accelerate's launch helpers (``_validate_launch_command``,
``prepare_simple_launcher_cmd_env``, ``prepare_multi_gpu_env``) over ``accel launch``'s
resolution. Nothing is started."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from accel.commands.launch import _validate_launch_command, launch_command_parser
from accel.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

KMP = ("KMP_AFFINITY", "KMP_BLOCKTIME")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)  # no default config file
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config_home"))
    for name in (*KMP, "ACCEL_DEVICE", "ACCEL_MIXED_PRECISION", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


def test_validate_writes_the_resolved_values_in_accelerates_names() -> None:
    args = launch_command_parser().parse_args(["--cpu", "-n", "2", "train.py", "--lr", "1"])
    args, config, from_config = _validate_launch_command(args)
    assert (args.num_processes, args.num_machines, args.gpu_ids, args.mixed_precision) == \
        (2, 1, "all", "no")
    assert (args.cpu, args.use_cpu, args.multi_gpu, args.debug) == (True, True, False, False)
    assert (args.training_script, args.training_script_args) == ("train.py", ["--lr", "1"])
    assert (config, from_config) == (None, False)
    # what came from defaults stays a default: the workers are not told mixed_precision "no"
    _, env = prepare_simple_launcher_cmd_env(args)
    assert "ACCEL_MIXED_PRECISION" not in env and env["ACCEL_DEVICE"] == "cpu"
    args = launch_command_parser().parse_args(["--mixed_precision", "bf16", "t.py"])
    _, env = prepare_simple_launcher_cmd_env(_validate_launch_command(args)[0])
    assert env["ACCEL_MIXED_PRECISION"] == "bf16"


def test_validate_reports_the_config_file_and_refuses_deepspeed(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: MULTI_CPU\nnum_processes: 3\nmixed_precision: bf16\n")
    args = launch_command_parser().parse_args(["--config_file", str(path), "t.py"])
    args, config, from_config = _validate_launch_command(args)
    assert config is not None and config.num_processes == 3
    assert (args.num_processes, args.mixed_precision, from_config) == (3, "bf16", True)
    with pytest.raises(ValueError, match="--use_deepspeed: accel has no DeepSpeed"):
        _validate_launch_command(launch_command_parser().parse_args(["--use_deepspeed", "t.py"]))


def test_cpu_launch_sets_intel_openmp_only_when_the_cpu_is_chosen() -> None:
    parser = launch_command_parser()
    cmd, env = prepare_simple_launcher_cmd_env(parser.parse_args(["--cpu", "t.py", "-x"]))
    assert cmd == [sys.executable, "-u", "-m", "accel.launch.bootstrap", "t.py", "-x"]
    assert (env["KMP_AFFINITY"], env["KMP_BLOCKTIME"]) == ("granularity=fine,compact,1,0", "1")
    assert env["ACCEL_DEVICE"] == "cpu" and env["ACCEL_LAUNCHED"] == "1"
    # several processes on one machine would pin their threads to the same cores
    _, env = prepare_simple_launcher_cmd_env(parser.parse_args(["--cpu", "-n", "2", "t.py"]))
    assert not set(KMP) & set(env)
    if not __import__("torch").cuda.is_available():  # the device is detected, not chosen
        _, env = prepare_simple_launcher_cmd_env(parser.parse_args(["t.py"]))
        assert not set(KMP) & set(env)


def test_prepare_multi_gpu_env_takes_accelerates_namespace() -> None:
    args = argparse.Namespace(
        num_processes=2, num_machines=1, main_process_ip="127.0.0.1", main_process_port=0,
        machine_rank=0, module=False, no_python=False, debug=False, gpu_ids="all", cpu=True,
        mixed_precision="bf16", dynamo_backend="NO", use_fsdp=False, fsdp_version=None,
        fsdp_reshard_after_forward=False, parallelism_config_dp_shard_size=1,
        use_deepspeed=False, use_megatron_lm=False, use_tp=False, same_network=False,
        num_cpu_threads_per_process=3, enable_cpu_affinity=False, training_script="t.py",
        training_script_args=[])
    env = prepare_multi_gpu_env(args)
    assert args.master_port.isdigit() and args.master_port != "0"
    assert args.main_process_port == int(args.master_port) and args.nproc_per_node == "2"
    assert (env["ACCEL_MIXED_PRECISION"], env["OMP_NUM_THREADS"]) == ("bf16", "3")
    several = argparse.Namespace(**{**vars(args), "num_processes": 4, "num_machines": 2,
                                    "main_process_ip": "10.0.0.1", "main_process_port": 29501})
    prepare_multi_gpu_env(several)
    assert (several.nnodes, several.node_rank, several.nproc_per_node) == ("2", 0, "2")
    assert several.rdzv_endpoint == "10.0.0.1:29501"
    with pytest.raises(ValueError, match="--use_megatron_lm: accel has no Megatron-LM"):
        prepare_multi_gpu_env(argparse.Namespace(**{**vars(args), "use_megatron_lm": True}))


def test_parameter_server_jobs_get_their_layout() -> None:
    args = launch_command_parser().parse_args(["--cpu", "--server_num", "1", "--worker_num", "2",
                                               "t.py"])
    _, env = prepare_simple_launcher_cmd_env(args)
    assert env["ACCEL_PS_LAYOUT"] == "1:2" and env["ACCEL_NUM_PROCESSES"] == "3"
