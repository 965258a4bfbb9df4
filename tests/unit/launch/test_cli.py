"""The ``accel`` command line: exact torchrun argv, precedence and sources, bad inputs."""

from __future__ import annotations

import io
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from accel.launch import cli, core
from accel.launch.config_file import ConfigFile, parse_config, read_config
from accel.launch.errors import CLIError
from accel.launch.report import Failure, failure_from_error_data, format_failure_report
from accel.launch.settings import LaunchSettings, resolve_settings, settings_table
from accel.launch.torchrun import build_torchrun_argv, worker_env

PY = "/usr/bin/python3"
BOOT = [PY, "-u", "-m", "accel.launch.bootstrap"]


def settings(argv: list[str], environ: Mapping[str, str] | None = None,
             config: ConfigFile | None = None, gpus: int = 0, cpus: int = 8,
             local: tuple[str, ...] = ()) -> LaunchSettings:
    args = cli.build_parser().parse_args(["launch", *argv])
    flags: dict[str, Any] = {k: v for k, v in vars(args).items() if k != "command"}
    flags["python"] = PY
    return resolve_settings(flags, environ=environ or {}, config=config, gpu_count=lambda: gpus,
                            cpu_count=cpus, run_id="RID", is_local_address=lambda ip: ip in local,
                            free_port=lambda: 12345)


def argv(*args: str, **kwargs: Any) -> list[str]:
    return build_torchrun_argv(settings(list(args), **kwargs))


SINGLE = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", "RID"]
DEFAULTS = ["--max-restarts", "0", "--monitor-interval", "0.1"]


# ---------------------------------------------------------------- exact torchrun argv
def test_cpu_processes_single_node() -> None:
    assert argv("--cpu", "-n", "4", "train.py", "--lr", "1", "-n", "3") == [
        "--nnodes", "1", "--nproc-per-node", "4", *SINGLE, *DEFAULTS, "--no-python", *BOOT,
        "train.py", "--lr", "1", "-n", "3"]


def test_one_process_per_gpu_by_default_and_one_without_gpus() -> None:
    assert argv("train.py", gpus=4)[:4] == ["--nnodes", "1", "--nproc-per-node", "4"]
    assert argv("train.py", gpus=0)[:4] == ["--nnodes", "1", "--nproc-per-node", "1"]
    assert argv("-n", "3", "train.py", gpus=0)[3] == "3"  # CPU-only machine: N gloo processes


def test_dash_and_underscore_spellings_are_the_same_flag() -> None:
    a = settings(["--num-processes", "2", "--mixed-precision", "bf16", "--gradient-accumulation-"
                  "steps", "4", "--num-cpu-threads-per-process", "3", "--cpu", "t.py"])
    b = settings(["--num_processes", "2", "--mixed_precision", "bf16", "--gradient_accumulation_"
                  "steps", "4", "--num_cpu_threads_per_process", "3", "--cpu", "t.py"])
    assert a == b
    assert (a.num_processes, a.mixed_precision, a.gradient_accumulation_steps,
            a.num_cpu_threads_per_process) == (2, "bf16", 4, 3)


def test_module_target_and_passthrough_options() -> None:
    got = argv("--cpu", "-n", "2", "--tee", "3", "--log-dir", "/tmp/logs", "--max_restarts", "2",
               "--monitor_interval", "0.5", "--rdzv_conf", "join_timeout=60", "-m", "pkg.train",
               "--epochs", "3")
    assert got == ["--nnodes", "1", "--nproc-per-node", "2", *SINGLE, "--rdzv-conf",
                   "join_timeout=60", "--max-restarts", "2", "--monitor-interval", "0.5",
                   "--tee", "3", "--log-dir", "/tmp/logs", "--no-python", *BOOT, "-m",
                   "pkg.train", "--epochs", "3"]


def test_single_node_explicit_port_and_static_backend() -> None:
    assert argv("--cpu", "--main_process_port", "29400", "t.py")[5:8] == [
        "c10d", "--rdzv-endpoint", "127.0.0.1:29400"]
    assert argv("--cpu", "--rdzv_backend", "static", "t.py")[4:12] == [
        "--rdzv-backend", "static", "--node-rank", "0", "--master-addr", "127.0.0.1",
        "--master-port", "12345"]


def test_multi_node_static_and_c10d() -> None:
    common = ["--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
              "--main_process_port", "29501", "-n", "8", "t.py"]
    s = settings(common, gpus=4)
    assert build_torchrun_argv(s) == [
        "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "static", "--node-rank", "1",
        "--master-addr", "10.0.0.1", "--master-port", "29501", *DEFAULTS, "--no-python", *BOOT,
        "t.py"]
    assert [w for w in s.warnings if "unauthenticated" in w and "10.0.0.1:29501" in w]
    assert argv("--rdzv_backend", "c10d", *common, gpus=4)[4:10] == [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29501", "--rdzv-id", "accel"]


def test_paddle_style_ips_sets_rank_from_the_local_address() -> None:
    s = settings(["--ips", "10.255.0.1,127.0.0.1", "--main_process_port", "29500", "--cpu", "-n",
                  "4", "t.py"], local=("127.0.0.1",))
    assert (s.num_machines, s.machine_rank, s.main_process_ip) == (2, 1, "10.255.0.1")
    assert s.sources["machine_rank"] == "flag --ips"
    assert build_torchrun_argv(s)[:12] == [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "static", "--node-rank", "1",
        "--master-addr", "10.255.0.1", "--master-port", "29500"]
    with pytest.raises(CLIError, match="none of these addresses"):
        settings(["--ips", "10.255.0.1,10.255.0.2", "t.py"])
    assert cli._is_local_address("127.0.0.1") and not cli._is_local_address("192.0.2.77")


# ---------------------------------------------------------------- precedence and sources
def test_precedence_flag_env_config_default(tmp_path: Path) -> None:
    cfg = parse_config({"mixed_precision": "bf16", "num_processes": 3, "use_cpu": True},
                       str(tmp_path / "c.yaml"))
    env = {"ACCEL_MIXED_PRECISION": "fp16", "OMP_NUM_THREADS": "5"}
    s = settings(["--mixed_precision", "no", "t.py"], env, cfg)
    assert (s.mixed_precision, s.sources["mixed_precision"]) == ("no", "flag --mixed_precision")
    s = settings(["t.py"], env, cfg)
    assert (s.mixed_precision, s.sources["mixed_precision"]) == ("fp16",
                                                                 "env ACCEL_MIXED_PRECISION")
    assert (s.num_cpu_threads_per_process, s.sources["num_cpu_threads_per_process"]) == (
        5, "env OMP_NUM_THREADS")
    assert (s.num_processes, s.sources["num_processes"]) == (3, f"config {cfg.path}")
    assert (s.device, s.sources["device"]) == ("cpu", f"config {cfg.path}")
    s = settings(["t.py"], {}, cfg)
    assert s.mixed_precision == "bf16" and s.sources["mixed_precision"] == f"config {cfg.path}"
    s = settings(["t.py"], {}, None, cpus=8)
    assert (s.mixed_precision, s.sources["mixed_precision"]) == ("no", "default")
    assert s.num_cpu_threads_per_process == 8 and s.sources["device"] == "detected (no GPU)"
    assert settings(["--cpu", "-n", "3", "t.py"], cpus=8).num_cpu_threads_per_process == 2


def test_settings_table_names_every_source(tmp_path: Path) -> None:
    cfg = parse_config({"mixed_precision": "bf16"}, str(tmp_path / "c.yaml"))
    s = settings(["--cpu", "-n", "2", "t.py"], {"ACCEL_GRADIENT_ACCUMULATION_STEPS": "4"}, cfg)
    table = settings_table(s, "flag --config_file")
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "flag --num_processes" in rows["num_processes"] and " 2 " in rows["num_processes"]
    assert "flag --cpu" in rows["device"]
    assert "env ACCEL_GRADIENT_ACCUMULATION_STEPS" in rows["gradient_accumulation_steps"]
    assert f"config {cfg.path}" in rows["mixed_precision"] and "bf16" in rows["mixed_precision"]
    assert "default" in rows["max_restarts"]
    assert str(cfg.path) in rows["config"] and "flag --config_file" in rows["config"]


def test_worker_env_exports_only_chosen_settings() -> None:
    env = worker_env(settings(["--cpu", "-n", "2", "--debug", "t.py"]))
    assert env["ACCEL_DEVICE"] == "cpu" and env["ACCEL_DEBUG"] == "1"
    assert env["ACCEL_LAUNCHED"] == "1" and env["OMP_NUM_THREADS"] == "4"
    assert "ACCEL_MIXED_PRECISION" not in env and "ACCEL_GRADIENT_ACCUMULATION_STEPS" not in env
    env = worker_env(settings(["--mixed_precision", "bf16", "--gradient_accumulation_steps", "8",
                               "--gpu_ids", "1,2", "t.py"], {"CUDA_VISIBLE_DEVICES": "4,5,6"},
                              gpus=3))
    assert (env["ACCEL_MIXED_PRECISION"], env["ACCEL_GRADIENT_ACCUMULATION_STEPS"]) == ("bf16",
                                                                                        "8")
    assert env["ACCEL_DEVICE"] == "cuda" and env["CUDA_VISIBLE_DEVICES"] == "5,6"


def test_accelerate_config_is_mapped_and_unknown_keys_listed(tmp_path: Path) -> None:
    path = tmp_path / "accelerate.yaml"
    path.write_text(textwrap.dedent("""\
        compute_environment: LOCAL_MACHINE
        distributed_type: MULTI_GPU
        downcast_bf16: 'no'
        gpu_ids: all
        machine_rank: 0
        main_training_function: main
        mixed_precision: no
        num_machines: 1
        num_processes: 2
        rdzv_backend: static
        same_network: true
        tpu_env: []
        use_cpu: false
        fsdp_config: {fsdp_sharding_strategy: FULL_SHARD}
        my_own_key: 1
        """))
    cfg = read_config(path)
    assert cfg.values == {"device": "cuda", "machine_rank": 0, "mixed_precision": "no",
                          "num_machines": 1, "num_processes": 2, "rdzv_backend": "static",
                          "same_network": True}
    assert cfg.ignored == ["fsdp_config", "my_own_key"]  # not FSDP: its block is not used
    assert cfg.unsupported is None
    with pytest.raises(CLIError, match="MULTI_NPU.*not supported"):
        parse_config({"distributed_type": "MULTI_NPU"}, "x.yaml")
    assert parse_config({"distributed_type": "NO"}, "x").values == {"num_processes": 1}


# ---------------------------------------------------------------- errors: one line, exit 2
def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture()
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_bad_flags_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], script: str) -> None:
    for args, needle in [(("launch", "--bogus", script), "unrecognized arguments: --bogus"),
                         (("launch", "-n", "-2", script), "must be an integer >= 1, got '-2'"),
                         (("launch", "-n", "0", script), "must be an integer >= 1"),
                         (("launch", "--mixed_precision", "fp8", script), "invalid choice"),
                         (("launch", "--main_process_port", "70000", script), "[0, 65535]"),
                         (("launch",), "no script given"),
                         (("launch", "missing_script.py"), "does not exist")]:
        code, err = run_main(capsys, *args)
        assert code == 2 and needle in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err


def test_bad_config_files_exit_2(capsys: pytest.CaptureFixture[str], script: str,
                                 tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cases = {
        "missing.yaml": (None, "does not exist"),
        "bad.yaml": ("num_processes: [1, 2\n", "not valid YAML"),
        "tag.yaml": (f"x: !!python/object/apply:os.system ['touch {marker}']\n",
                     "tag that is not allowed"),
        "list.yaml": ("- 1\n- 2\n", "expected a mapping"),
        "type.yaml": ("num_processes: two\n", "num_processes in"),
    }
    for name, (text, needle) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        code, err = run_main(capsys, "launch", "--cpu", "--config_file", str(path), script)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (name, err)
    assert not marker.exists()


def test_resolution_errors(capsys: pytest.CaptureFixture[str], script: str,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CLIError, match="only 2 GPU"):
        settings(["-n", "4", "t.py"], gpus=2)
    with pytest.raises(CLIError, match="--main_process_ip and --main_process_port"):
        settings(["--num_machines", "2", "--cpu", "-n", "2", "t.py"])
    with pytest.raises(CLIError, match="multiple of 2"):
        settings(["--num_machines", "2", "--main_process_ip", "h", "--main_process_port", "1",
                  "--cpu", "-n", "3", "t.py"])
    with pytest.raises(CLIError, match="no GPU is visible"):
        settings(["t.py"], {"ACCEL_DEVICE": "cuda"})
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "x")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(Path(script).parent / "nothing"))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    code, err = run_main(capsys, "launch", "--cpu", script)
    assert code == 2 and "ACCEL_GRADIENT_ACCUMULATION_STEPS" in err


def test_missing_pyyaml_is_a_clear_error(capsys: pytest.CaptureFixture[str], script: str,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.yaml").write_text("num_processes: 1\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    code, err = run_main(capsys, "launch", "--config_file", str(tmp_path / "c.yaml"), script)
    assert code == 2 and "pip install 'accel[yaml]'" in err


# ---------------------------------------------------------------- accel config
def test_config_default_and_interactive(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "gpu_count", lambda: 0)
    path = tmp_path / "sub" / "cfg.yaml"
    assert run_main(capsys, "config", "default", "--config_file", str(path))[0] == 0
    assert read_config(path).values == {"device": "cpu", "machine_rank": 0,
                                        "mixed_precision": "no", "num_machines": 1,
                                        "num_processes": 1}
    code, err = run_main(capsys, "config", "default", "--config_file", str(path))
    assert code == 2 and "--force" in err
    answers = "2\n1\n10.1.2.3\n\nyes\nthree\n4\n\nbf16\n"  # one invalid answer is asked again
    monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
    assert cli.main(["config", "--config_file", str(path)]) == 0
    assert "please try again" in capsys.readouterr().out
    cfg = read_config(path)
    assert cfg.values == {"device": "cpu", "machine_rank": 1, "main_process_ip": "10.1.2.3",
                          "main_process_port": 29500, "mixed_precision": "bf16",
                          "num_machines": 2, "num_processes": 4}
    assert cfg.ignored == []
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))  # input ends before the last question
    code, err = run_main(capsys, "config", "--config_file", str(path))
    assert code == 2 and "end of input" in err


# ---------------------------------------------------------------- ROOT CAUSE formatting
def _error_data(message: str, tb: str, t: int) -> dict[str, Any]:
    return {"message": {"message": message, "extraInfo": {
        "py_callstack": tb, "timestamp": "0", "accel": {"host": "h", "pid": 7, "time_ns": t}}}}


def test_root_cause_is_the_real_error_not_the_peer_loss() -> None:
    peer = failure_from_error_data(0, local_rank=0, pid=10, exitcode=1, data=_error_data(
        "RuntimeError: Connection closed by peer", "Traceback\nRuntimeError: Connection closed "
        "by peer", 1), fallback_time_ns=0)
    real = failure_from_error_data(1, local_rank=1, pid=11, exitcode=1, data=_error_data(
        "ValueError: boom", "Traceback (most recent call last):\nValueError: boom", 2), fallback_time_ns=0)
    killed = failure_from_error_data(2, local_rank=0, pid=12, exitcode=-15, data={"message": "<NONE>"}, fallback_time_ns=0)  # torch's "none"
    text = format_failure_report([peer, real, killed])
    assert text.count("ROOT CAUSE") == 1 and "ROOT CAUSE: rank 1 (local rank 1) on host h, " \
        "pid 7, exit code 1" in text
    assert "ValueError: boom" in text.split("=" * 72)[1]
    last = text.splitlines()[-1]
    assert "2 other rank(s)" in last and "rank 0" in last and "rank 2 (pid 12, SIGTERM)" in last
    assert killed.secondary and peer.secondary and not real.secondary
    only = format_failure_report([Failure(rank=3, local_rank=0, pid=5, exitcode=-9, host="h",
                                          message="killed by SIGKILL")])
    assert "ROOT CAUSE: rank 3" in only and "SIGKILL" in only and "no Python traceback" in only


def test_a_parameter_server_jobs_report_names_each_ranks_role() -> None:
    from accel.env import rank_roles

    roles = rank_roles("1:2")  # what accel launch --server_num 1 --worker_num 2 exports
    server = Failure(rank=0, local_rank=0, pid=5, exitcode=-9, host="h",
                     message="killed by SIGKILL")
    workers = [Failure(rank=r, local_rank=r, pid=5 + r, exitcode=-15, host="h",
                       message="killed by SIGTERM") for r in (1, 2)]
    text = format_failure_report([server, *workers], roles=roles)
    assert "ROOT CAUSE: rank 0 (local rank 0, parameter server 0) on host h, pid 5" in text
    assert text.splitlines()[-1].endswith("rank 1 (worker 0, pid 6, SIGTERM); "
                                          "rank 2 (worker 1, pid 7, SIGTERM)")
    assert rank_roles("1:1,2:1") == {0: "parameter server 0", 1: "worker 0",
                                     2: "parameter server 1", 3: "parameter server 2",
                                     4: "worker 1"}


# ---------------------------------------------------------------- the default config file
def test_default_config_is_used_only_if_present_and_said_so(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config, note = cli._locate_config(None)
    assert config is None and note == f"none (no file at {tmp_path}/accel/default_config.yaml)"
    (tmp_path / "accel").mkdir()
    (tmp_path / "accel" / "default_config.yaml").write_text("num_processes: 3\n")
    config, note = cli._locate_config(None)
    assert config is not None and config.values == {"num_processes": 3}
    assert note == "default location (used because it exists)"
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(tmp_path / "gone.yaml"))
    with pytest.raises(CLIError, match="gone.yaml does not exist"):
        cli._locate_config(None)


# ---------------------------------------------------------------- the launch core
def test_rendezvous_as_torchrun_args_and_launch_config() -> None:
    single = core.Rendezvous(backend="c10d", host="::1", port=0, run_id="RID")
    assert single.torchrun_args() == ["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:0",
                                      "--rdzv-id", "RID"]
    assert single.launch_config() == {"min_nodes": 1, "max_nodes": 1, "run_id": "RID",
                                      "rdzv_backend": "c10d", "rdzv_endpoint": "[::1]:0"}
    static = core.Rendezvous(backend="static", host="10.0.0.1", port=29500, run_id="accel",
                             num_nodes=2, node_rank=1, conf="join_timeout=60")
    assert static.torchrun_args() == ["--rdzv-backend", "static", "--node-rank", "1",
                                      "--master-addr", "10.0.0.1", "--master-port", "29500",
                                      "--rdzv-conf", "join_timeout=60"]
    assert static.launch_config()["rdzv_configs"] == {"join_timeout": "60", "rank": 1}
    assert (core.default_backend(1), core.default_backend(2)) == ("c10d", "static")
    assert core.default_port("c10d", 1, lambda: 7) == 0
    assert core.default_port("static", 1, lambda: 7) == 7
    assert core.default_port("static", 2, lambda: 7) == 29500


def test_notebook_and_accel_launch_choose_the_same_rendezvous() -> None:
    import warnings

    from accel.launch import notebook

    one = notebook._rendezvous("127.0.0.1", port=None, node_rank=0, num_nodes=1)
    assert (one.backend, one.port) == ("c10d", 0) and len(one.run_id) == 32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        two = notebook._rendezvous("10.0.0.1", port=None, node_rank=1, num_nodes=2)
    assert "10.0.0.1:29500 is unauthenticated" in str(caught[0].message)
    s = settings(["--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
                  "--main_process_port", "29500", "--cpu", "-n", "4", "t.py"])
    from accel.launch.torchrun import rendezvous_of

    assert two == rendezvous_of(s)  # every machine shares the run id: static prefixes keys with it


def test_worker_spec_environment() -> None:
    env = core.WorkerSpec(device="cpu", num_threads=3, cuda_visible_devices="").environment()
    assert env == {"ACCEL_LAUNCHED": "1", "ACCEL_DEVICE": "cpu", "ACCEL_NUM_THREADS": "3",
                   "OMP_NUM_THREADS": "3", "CUDA_VISIBLE_DEVICES": ""}
    env = core.WorkerSpec(device="cuda", num_threads=1, mixed_precision="bf16",
                          config_file="c.yaml").environment()
    assert env["ACCEL_MIXED_PRECISION"] == "bf16" and Path(env["ACCEL_CONFIG_FILE"]).is_absolute()
    assert "CUDA_VISIBLE_DEVICES" not in env
    restarts = worker_env(settings(["--cpu", "--max_restarts", "1", "t.py"]))
    assert restarts["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert (restarts["ACCEL_NUM_PROCESSES"], restarts["ACCEL_NUM_MACHINES"]) == ("1", "1")


def test_extract_failures_reads_our_error_files() -> None:
    from types import SimpleNamespace

    data = _error_data("ValueError: boom", "Traceback\nValueError: boom", 5)
    data["message"]["extraInfo"]["accel"]["exception"] = "PAYLOAD"
    failures = {1: SimpleNamespace(local_rank=1, pid=9, exitcode=1, error_file_data=data),
                0: SimpleNamespace(local_rank=0, pid=8, exitcode=-15, error_file_data="<NONE>")}
    got = core.extract_failures(failures, now_ns=100)
    assert [(f.rank, f.pid, f.time_ns, f.traceback is None) for f in got] == [
        (1, 7, 5, False), (0, 8, 100, True)]
    assert core.accel_extra(data)["exception"] == "PAYLOAD"
    assert core.accel_extra("<NONE>") == {} and core.accel_extra({"message": "x"}) == {}


def test_gpu_ids_all_means_every_visible_gpu() -> None:
    s = settings(["--gpu_ids", "all", "t.py"], gpus=2)
    assert (s.device, s.gpu_ids, s.num_processes, s.cuda_visible_devices) == ("cuda", None, 2,
                                                                             None)
