"""Accelerate's remaining ``accel launch`` flags: resolution, torchrun/mpirun argv, worker env,
refusals, and Accelerate YAML files of every ``distributed_type``."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from accel.env import DYNAMO_BACKENDS, LaunchEnvironmentError, read_settings
from accel.launch import cli
from accel.launch.config_file import parse_config, read_config
from accel.launch.errors import CLIError
from accel.launch.mpirun import (
    HYDRA,
    OPENMPI,
    build_mpirun_argv,
    first_host,
    ignored_settings,
    mpi_flavour,
)
from accel.launch.refused import REFUSED
from accel.launch.settings import settings_table
from accel.launch.torchrun import build_torchrun_argv, worker_env
from tests.unit.launch.test_cli import BOOT, argv, run_main, settings


@pytest.fixture()
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


# ---------------------------------------------------------------- --multi_gpu / --tpu
def test_multi_gpu_is_a_no_op_when_processes_imply_several_gpus() -> None:
    assert argv("--multi_gpu", "t.py", gpus=4) == argv("t.py", gpus=4)
    assert argv("--multi_gpu", "-n", "2", "t.py", gpus=4) == argv("-n", "2", "t.py", gpus=4)
    s = settings(["--multi_gpu", "t.py"], gpus=2)
    assert (s.device, s.num_processes, s.sources["device"]) == ("cuda", 2, "flag --multi_gpu")
    # The flag beats ACCEL_DEVICE and a config file's MULTI_CPU, as flags do.
    config = parse_config({"distributed_type": "MULTI_CPU"}, "c.yaml")
    assert settings(["--multi_gpu", "t.py"], {"ACCEL_DEVICE": "cpu"}, config, gpus=2).device == \
        "cuda"


def test_multi_gpu_with_fewer_than_two_processes_says_what_to_do() -> None:
    with pytest.raises(CLIError, match=r"only 1 GPU is visible and -n was not given; drop "
                       r"--multi_gpu .* or pass --cpu -n N"):
        settings(["--multi_gpu", "t.py"], gpus=1)
    with pytest.raises(CLIError, match=r"at least 2 processes .*got num_processes 1 \(flag "
                       r"--num_processes\); pass -n 2 or more"):
        settings(["--multi_gpu", "-n", "1", "t.py"], gpus=2)
    with pytest.raises(CLIError, match=r"cuda was requested \(flag --multi_gpu\) but no GPU"):
        settings(["--multi_gpu", "-n", "2", "t.py"], gpus=0)
    # Several machines with one GPU each: 2 processes in all, as Accelerate counts them.
    s = settings(["--multi_gpu", "--num_machines", "2", "--main_process_ip", "10.0.0.1",
                  "--main_process_port", "29500", "t.py"], gpus=1)
    assert s.num_processes == 2


@pytest.mark.parametrize("pair", [("--cpu", "--multi_gpu"), ("--cpu", "--tpu"),
                                  ("--multi_gpu", "--tpu")])
def test_device_flags_contradict_each_other(pair: tuple[str, str]) -> None:
    # Accelerate: "You can only use one of --cpu, --multi_gpu, --tpu ... at a time".
    with pytest.raises(CLIError, match=f"{pair[0]} and {pair[1]} contradict each other"):
        settings([*pair, "-n", "2", "t.py"], gpus=2)


def test_tpu_chooses_xla() -> None:
    s = settings(["--tpu", "t.py"], gpus=2)
    assert (s.device, s.num_processes, s.sources["device"]) == ("xla", 1, "flag --tpu")
    assert worker_env(s)["ACCEL_DEVICE"] == "xla"


# ---------------------------------------------------------------- dynamo
def test_dynamo_flags_reach_workers_as_accel_variables() -> None:
    s = settings(["--cpu", "--dynamo_backend", "INDUCTOR", "--dynamo_mode", "max-autotune",
                  "--dynamo_use_fullgraph", "--dynamo_use_dynamic",
                  "--dynamo_use_regional_compilation", "t.py"])
    env = worker_env(s)
    assert {k: v for k, v in env.items() if "DYNAMO" in k} == {
        "ACCEL_DYNAMO_BACKEND": "inductor", "ACCEL_DYNAMO_MODE": "max-autotune",
        "ACCEL_DYNAMO_USE_FULLGRAPH": "1", "ACCEL_DYNAMO_USE_DYNAMIC": "1",
        "ACCEL_DYNAMO_USE_REGIONAL_COMPILATION": "1"}
    got = read_settings(env)  # what a worker reads back: typed
    assert (got.dynamo_backend, got.dynamo_mode, got.dynamo_use_fullgraph,
            got.dynamo_use_dynamic, got.dynamo_use_regional_compilation) == (
        "inductor", "max-autotune", True, True, True)
    assert re.search(r"\n  dynamo_backend +inductor +flag --dynamo_backend\n", settings_table(s))
    # Nothing chosen: nothing exported (a worker's own settings are not contradicted).
    assert not [k for k in worker_env(settings(["--cpu", "t.py"])) if "DYNAMO" in k]


def test_dynamo_sources_flag_env_config() -> None:
    config = parse_config({"distributed_type": "MULTI_CPU", "dynamo_config": {
        "dynamo_backend": "EAGER", "mode": "reduce-overhead", "dynamo_use_dynamic": False}},
        "c.yaml")
    s = settings(["t.py"], {"ACCEL_DYNAMO_BACKEND": "aot_eager"}, config)
    assert s.dynamo == {"dynamo_backend": "aot_eager", "dynamo_mode": "reduce-overhead",
                        "dynamo_use_dynamic": False}
    assert s.sources["dynamo_backend"] == "env ACCEL_DYNAMO_BACKEND"
    assert s.sources["dynamo_mode"] == "config c.yaml"
    s = settings(["--dynamo_backend", "no", "t.py"], {"ACCEL_DYNAMO_BACKEND": "aot_eager"})
    assert s.dynamo == {"dynamo_backend": "no"}
    # Accelerate < 0.16 wrote `dynamo_backend` at the top level.
    assert parse_config({"dynamo_backend": "NO"}, "c").values == {"dynamo_backend": "NO"}
    assert settings(["t.py"], config=parse_config({"dynamo_backend": "NO"}, "c")).dynamo == {
        "dynamo_backend": "no"}


def test_bad_dynamo_values_are_one_line_errors() -> None:
    with pytest.raises(CLIError, match="--dynamo_backend='fast' is not a dynamo backend; "
                       "expected one of no, eager, aot_eager, inductor"):
        settings(["--dynamo_backend", "fast", "t.py"])
    with pytest.raises(CLIError, match="ACCEL_DYNAMO_MODE='turbo' is not a torch.compile mode"):
        settings(["t.py"], {"ACCEL_DYNAMO_MODE": "turbo"})
    with pytest.raises(CLIError, match="dynamo_use_fullgraph in c.yaml must be true or false"):
        settings(["t.py"], config=parse_config({"dynamo_config": {"use_fullgraph": "x"}}, "c.yaml"))


def test_read_settings_validates_dynamo_variables() -> None:
    assert read_settings({}).dynamo_backend is None
    assert read_settings({"ACCEL_DYNAMO_BACKEND": "TorchXLA_Trace_Once"}).dynamo_backend == \
        "torchxla_trace_once"
    assert read_settings({"ACCEL_DYNAMO_USE_FULLGRAPH": "False"}).dynamo_use_fullgraph is False
    with pytest.raises(LaunchEnvironmentError, match="ACCEL_DYNAMO_BACKEND='tvmx' is not a "
                       "dynamo backend"):
        read_settings({"ACCEL_DYNAMO_BACKEND": "tvmx"})
    with pytest.raises(LaunchEnvironmentError, match="ACCEL_DYNAMO_USE_DYNAMIC must be true or "
                       "false"):
        read_settings({"ACCEL_DYNAMO_USE_DYNAMIC": "sometimes"})
    assert len(DYNAMO_BACKENDS) == 16 and DYNAMO_BACKENDS[0] == "no"


# ---------------------------------------------------------------- rendezvous flags
MULTI = ["--num_machines", "2", "--machine_rank", "1"]


def test_rdzv_endpoint_sets_the_main_process_address() -> None:
    got = argv(*MULTI, "--rdzv_endpoint", "10.0.0.1:29400", "t.py", gpus=1)
    assert got[4:12] == ["--rdzv-backend", "static", "--node-rank", "1", "--master-addr",
                         "10.0.0.1", "--master-port", "29400"]
    got = argv(*MULTI, "--rdzv_backend", "c10d", "--rdzv_endpoint", "[fd00::1]:29400", "t.py",
               gpus=1)
    assert got[4:10] == ["--rdzv-backend", "c10d", "--rdzv-endpoint", "[fd00::1]:29400",
                         "--rdzv-id", "accel"]
    s = settings([*MULTI, "--rdzv_endpoint", "h:1", "--main_process_ip", "h", "t.py"], gpus=1)
    assert s.sources["main_process_ip"] == s.sources["main_process_port"] == \
        "flag --rdzv_endpoint"
    # One machine: the c10d endpoint itself.
    assert argv("--cpu", "--rdzv_endpoint", "127.0.0.1:29411", "t.py")[4:8] == [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29411"]


def test_rdzv_endpoint_conflicts_and_bad_values() -> None:
    with pytest.raises(CLIError, match=r"--rdzv_endpoint 10.0.0.1:1 contradicts main_process_ip "
                       r"10.0.0.2 \(flag --main_process_ip\)"):
        settings([*MULTI, "--rdzv_endpoint", "10.0.0.1:1", "--main_process_ip", "10.0.0.2",
                  "t.py"], gpus=1)
    with pytest.raises(CLIError, match=r"contradicts main_process_port 29500 \(config c.yaml"):
        settings(["--rdzv_endpoint", "h:1", "t.py"],
                 config=parse_config({"main_process_port": 29500}, "c.yaml"))
    for bad in ("10.0.0.1", ":29500", "h:port", "h:70000"):
        with pytest.raises(CLIError, match="rdzv_endpoint"):
            settings(["--rdzv_endpoint", bad, "t.py"])


def test_same_network_is_accepted_and_changes_nothing() -> None:
    base = [*MULTI, "--main_process_ip", "10.0.0.1", "--main_process_port", "29500", "t.py"]
    assert argv("--same_network", *base, gpus=1) == argv(*base, gpus=1)
    assert parse_config({"same_network": False}, "c").values == {"same_network": False}


def test_role_and_short_tee() -> None:
    got = argv("--cpu", "--role", "trainer", "-t", "3", "--log_dir", "/tmp/l", "t.py")
    assert got[14:20] == ["--tee", "3", "--log-dir", "/tmp/l", "--role", "trainer"]


# ---------------------------------------------------------------- --enable_cpu_affinity
def test_cpu_affinity_is_torchrun_numa_binding_on_gpus() -> None:
    got = argv("--enable_cpu_affinity", "t.py", gpus=2)
    assert got[14:16] == ["--numa-binding", "node"]
    config = parse_config({"distributed_type": "MULTI_GPU", "enable_cpu_affinity": True}, "c")
    assert "--numa-binding" in argv("t.py", gpus=2, config=config)
    s = settings(["--cpu", "--enable_cpu_affinity", "t.py"])
    assert not s.enable_cpu_affinity and "--numa-binding" not in build_torchrun_argv(s)
    assert s.warnings == ("enable_cpu_affinity (flag --enable_cpu_affinity) is ignored: it binds "
                          "each worker to the CPUs of its GPU's NUMA node, and the device is cpu",)


# ---------------------------------------------------------------- --no_python / --module
def test_no_python_execs_the_target_through_the_bootstrap() -> None:
    got = argv("--cpu", "--no_python", "./run.sh", "--x", "1")
    assert got[-9:] == ["--no-python", *BOOT, "--no-python", "./run.sh", "--x", "1"]
    with pytest.raises(CLIError, match="--module and --no_python cannot be used together"):
        settings(["--no_python", "-m", "pkg"])


def test_no_python_needs_an_executable(capsys: pytest.CaptureFixture[str], script: str) -> None:
    code, err = run_main(capsys, "launch", "--cpu", "--no_python", "no-such-tool-xyz")
    assert code == 2 and "'no-such-tool-xyz' is not an executable file nor a command on PATH" in err
    code, err = run_main(capsys, "launch", "--cpu", "--no_python", script)  # not chmod +x
    assert code == 2 and "not an executable" in err


# ---------------------------------------------------------------- --mpirun_hostfile
def test_mpirun_argv_for_open_mpi_and_hydra(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# cluster\nnode1 slots=4\n\nnode2 slots=4  # second\n")
    assert first_host(str(hosts)) == ("node1", 2)
    s = settings(["--cpu", "-n", "8", "--num_machines", "2", "--num_cpu_threads_per_process",
                  "2", "--mpirun_hostfile", str(hosts), "train.py", "--lr", "1"])
    assert s.mpirun_hostfile == str(hosts) and s.warnings == ()
    env = {"ACCEL_DEVICE": "cpu", "OMP_NUM_THREADS": "2"}
    got = build_mpirun_argv(s, env=env, app="/usr/bin/mpirun", flavour=OPENMPI, hostfile=str(hosts), master_addr="node1")
    assert got == ["/usr/bin/mpirun", "--hostfile", str(hosts), "-n", "8", "--npernode", "4",
                   "--bind-to", "socket", "-x", "ACCEL_DEVICE=cpu", "-x", "OMP_NUM_THREADS=2",
                   "-x", "MASTER_ADDR=node1", *BOOT, "train.py", "--lr", "1"]
    s = settings(["--cpu", "-n", "2", "--main_process_port", "29555", "--mpirun_hostfile", "h",
                  "-m", "pkg.train"])
    got = build_mpirun_argv(s, env={"A": "1"}, app="mpiexec", flavour=HYDRA, hostfile="h", master_addr="127.0.0.1")
    assert got == ["mpiexec", "-f", "h", "-n", "2", "-ppn", "2", "-genv", "A", "1", "-genv",
                   "MASTER_ADDR", "127.0.0.1", "-genv", "MASTER_PORT", "29555", *BOOT, "-m",
                   "pkg.train"]


def test_mpirun_resolution_rules() -> None:
    config = parse_config({"distributed_type": "MULTI_CPU",
                           "mpirun_config": {"mpirun_hostfile": "~/hostfile"}}, "c.yaml")
    assert settings(["-n", "2", "t.py"], config=config).mpirun_hostfile == "~/hostfile"
    with pytest.raises(CLIError, match="--mpirun_hostfile starts CPU processes with mpirun .* "
                       "add --cpu"):
        settings(["--mpirun_hostfile", "h", "t.py"], gpus=2)
    # Several machines need no --main_process_ip: the hostfile names them.
    s = settings(["--cpu", "--num_machines", "2", "-n", "4", "--max_restarts", "1",
                  "--mpirun_hostfile", "h", "t.py"])
    assert ignored_settings(s) == ["max_restarts (flag --max_restarts) is ignored: mpirun "
                                   "starts the workers, not torchrun's agent"]


def test_mpi_flavour_detection() -> None:
    assert mpi_flavour(lambda name: f"/opt/{name}" if name == "mpirun" else None,
                       lambda app: "mpirun (Open MPI) 4.1.5") == ("/opt/mpirun", OPENMPI)
    assert mpi_flavour(lambda name: "/x/mpiexec" if name == "mpiexec" else None,
                       lambda app: "HYDRA build details:") == ("/x/mpiexec", HYDRA)
    with pytest.raises(CLIError, match="needs mpirun or mpiexec on PATH .* or drop "
                       "--mpirun_hostfile and start `accel launch --cpu --num_machines"):
        mpi_flavour(lambda name: None)


def test_mpirun_launch_without_mpi_is_a_one_line_error(
        capsys: pytest.CaptureFixture[str], script: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpirun here, whatever the machine has
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost\n")
    code, err = run_main(capsys, "launch", "-q", "--cpu", "-n", "2", "--mpirun_hostfile",
                         str(hosts), script)
    assert code == 2 and "needs mpirun or mpiexec on PATH" in err
    code, err = run_main(capsys, "launch", "-q", "--cpu", "--num_machines", "2", "-n", "2",
                         "--mpirun_hostfile", str(hosts), script)
    assert code == 2 and "--num_machines 2 but --mpirun_hostfile" in err
    code, err = run_main(capsys, "launch", "-q", "--cpu", "--mpirun_hostfile",
                         str(tmp_path / "none"), script)
    assert code == 2 and "cannot be read" in err


# ---------------------------------------------------------------- refused Accelerate flags
ROWS = [(reason, name, takes) for reason, flags in REFUSED for name, takes in flags.items()]


@pytest.mark.parametrize("reason,name,takes_value",
                         [row for i, row in enumerate(ROWS)
                          if i == 0 or ROWS[i - 1][0] != row[0] or row[1] == "mpirun_ccl"],
                         ids=lambda v: v if isinstance(v, str) and " " not in v else "")
def test_refused_flags_name_the_reason_and_alternative(
        capsys: pytest.CaptureFixture[str], script: str, reason: str, name: str,
        takes_value: bool) -> None:
    flag = f"--{name}"
    code, err = run_main(capsys, "launch", "--cpu", flag, *(["v"] if takes_value else []),
                         script)
    assert code == 2, err
    assert err == f"accel launch: error: {flag}: {reason}\n"
    assert any(word in reason for word in ("drop it", "use ", "run `accel", "call ", "keep"))


def test_every_refused_flag_is_hidden_and_keeps_the_script(
        capsys: pytest.CaptureFixture[str], script: str) -> None:
    help_text = cli.build_parser()._subparsers._group_actions[0].choices[  # type: ignore[union-attr]
        "launch"].format_help()
    for _, name, takes in ROWS:
        assert f"--{name} " not in help_text
        args = cli.build_parser().parse_args(
            ["launch", f"--{name.replace('_', '-')}", *(["x"] if takes else []), script, "-a"])
        assert (args.script, args.script_args) == (script, ["-a"])
        assert args.refused_flags == [f"--{name.replace('_', '-')}"]
    code, err = run_main(capsys, "launch", "--use_deepspeed", "--fp8_backend", "te", script)
    assert code == 2 and err.count("\n  --") == 2 and "not supported" in err


# ---------------------------------------------------------------- YAML distributed_type
@pytest.mark.parametrize("dist_type,device,processes", [
    ("MULTI_GPU", "cuda", 2), ("MULTI_CPU", "cpu", 1), ("NO", "cuda", 1), ("XLA", "xla", 1),
    ("TPU", "xla", 1)])
def test_accelerate_configs_of_each_type_load(tmp_path: Path, dist_type: str, device: str,
                                              processes: int) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(f"""\
        compute_environment: LOCAL_MACHINE
        distributed_type: {dist_type}
        enable_cpu_affinity: false
        same_network: true
        dynamo_config: {{}}
        mpirun_config: {{}}
        """))
    config = read_config(path)
    assert config.ignored == [] and config.unsupported is None
    s = settings(["t.py"], config=config, gpus=2)
    assert (s.device, s.num_processes) == (device, processes)


@pytest.mark.parametrize("dist_type,block", [("DEEPSPEED", "deepspeed_config"),
                                             ("MEGATRON_LM", "megatron_lm_config")])
def test_sharded_types_load_but_launch_refuses(tmp_path: Path, dist_type: str,
                                               block: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"distributed_type: {dist_type}\nnum_processes: 2\n"
                    f"{block}:\n  some_option: FULL_SHARD\n")
    config = read_config(path)  # the file loads
    assert config.ignored == [] and config.values["num_processes"] == 2
    assert config.unsupported is not None and "pass --multi_gpu" in config.unsupported
    with pytest.raises(CLIError, match=f"distributed_type {dist_type}: .*; to train with DDP "
                       "instead .*pass --multi_gpu \\(or --cpu\\), or set distributed_type: "
                       "MULTI_GPU"):
        settings(["t.py"], config=config, gpus=2)
    # A device flag overrides the file's type, as in Accelerate.
    assert settings(["--multi_gpu", "t.py"], config=config, gpus=2).num_processes == 2
    assert settings(["--cpu", "t.py"], config=config).device == "cpu"


def test_config_dynamo_and_unknown_nested_keys() -> None:
    config = parse_config({"dynamo_config": {"dynamo_backend": "INDUCTOR", "warp": 1},
                           "mpirun_config": {"mpirun_hostfile": "h", "extra": 2}}, "c")
    assert config.values == {"dynamo_backend": "INDUCTOR", "mpirun_hostfile": "h"}
    assert config.ignored == ["dynamo_config.warp", "mpirun_config.extra"]


