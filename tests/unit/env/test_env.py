"""accel.env: launcher detection and ACCEL_* settings, from explicit environ dicts."""

from __future__ import annotations

import pytest

from accel.env import (
    ACCEL_TABLE,
    ACCEL_VARIABLES,
    EnvSettings,
    LaunchEnvironmentError,
    LaunchInfo,
    accel_environment,
    agent_environment,
    agent_pid,
    apply,
    config_file_variable,
    config_home,
    cpu_count,
    cuda_visible_devices,
    detect_launch,
    error_file,
    expand_nodelist,
    formed_layout,
    gloo_socket_ifname,
    launch_setting_source,
    pjrt_device,
    read_settings,
    requested_layout,
    settings_environment,
    worker_environment,
    worker_ranks,
)
from accel.env._base import current

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29511"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "PMIX_NAMESPACE": "prterun-host-1234@1"}
MPICH = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
         "MASTER_ADDR": "node0"}
MVAPICH2 = {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2",
            "MV2_COMM_WORLD_LOCAL_RANK": "1", "MV2_COMM_WORLD_LOCAL_SIZE": "2", "MPIRUN_ID": "77"}
SLURM_ONE_NODE = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
                  "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_NODELIST": "gpu01",
                  "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
SLURM_THREE_NODES = {"SLURM_PROCID": "5", "SLURM_NTASKS": "99", "SLURM_STEP_NUM_TASKS": "7",
                     "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_STEP_NUM_NODES": "4",
                     "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
                     "SLURM_STEP_NODELIST": "gpu[01-03,7],cpu-a", "SLURM_JOB_ID": "4242"}


def _fields(info: LaunchInfo) -> tuple[object, ...]:
    return (info.launcher, info.rank, info.local_rank, info.world_size, info.local_world_size,
            info.node_rank)


# ------------------------------------------------------------------ no launcher, torchrun


def test_no_launcher_is_a_single_process() -> None:
    info = detect_launch({})
    assert _fields(info) == ("none", 0, 0, 1, 1, 0)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500)
    assert not info.is_distributed and info.num_nodes == 1


def test_torchrun_variables() -> None:
    env = {**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": "2"}
    info = detect_launch(env)
    assert _fields(info) == ("torchrun", 3, 1, 4, 2, 1)
    assert (info.master_addr, info.master_port) == ("10.0.0.1", 29511)
    assert info.use_agent_store and info.restart_count == 2
    assert info.is_distributed and info.num_nodes == 2


def test_torchrun_defaults_for_missing_local_and_node_variables() -> None:
    info = detect_launch({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    assert _fields(info) == ("torchrun", 1, 1, 2, 2, 0)
    assert info.master_port == 29500 and not info.use_agent_store and info.restart_count == 0


def test_torchrun_world_of_one_needs_no_master_addr() -> None:
    info = detect_launch({"RANK": "0", "WORLD_SIZE": "1"})
    assert _fields(info) == ("torchrun", 0, 0, 1, 1, 0)


# ------------------------------------------------------------------ MPI flavours


def test_openmpi_single_node_uses_localhost_and_job_derived_port() -> None:
    info = detect_launch(OPENMPI)
    assert _fields(info) == ("openmpi", 1, 1, 2, 2, 0)
    assert info.master_addr == "127.0.0.1"
    assert 20000 <= info.master_port < 40000


def test_openmpi_explicit_rendezvous_wins() -> None:
    info = detect_launch({**OPENMPI, "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"})
    assert (info.master_addr, info.master_port) == ("10.1.1.1", 1234)


def test_mpich_and_intel_mpi() -> None:
    info = detect_launch(MPICH)
    assert _fields(info) == ("mpich", 2, 0, 4, 2, 1)
    assert info.master_addr == "node0" and info.num_nodes == 2


def test_mvapich2() -> None:
    info = detect_launch(MVAPICH2)
    assert _fields(info) == ("mvapich2", 1, 1, 2, 2, 0)
    assert info.master_addr == "127.0.0.1"


def test_mpi_without_local_variables_assumes_one_node() -> None:
    info = detect_launch({"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert _fields(info) == ("mpich", 1, 1, 2, 2, 0)


def test_pmi_under_srun_takes_the_node_layout_from_slurm() -> None:
    # `srun --mpi=pmi2` sets PMI_RANK/PMI_SIZE without MPI_LOCALRANKID: rank 3 of 4 on node 1
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_JOBID": "4242.0", "SLURM_PROCID": "3",
           "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NODELIST": "n[07-08]"}
    info = detect_launch(env)
    assert _fields(info) == ("mpich", 3, 1, 4, 2, 1)
    assert info.master_addr == "n07"


@pytest.mark.parametrize("env", [
    {**OPENMPI, "OMPI_COMM_WORLD_SIZE": "4"},  # 2 per node, 4 in all: two nodes
    {**MPICH, "MASTER_ADDR": ""},
    {**MVAPICH2, "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_RANK": "3"},
])
def test_mpi_multi_node_without_master_addr_is_a_clear_error(env: dict[str, str]) -> None:
    with pytest.raises(LaunchEnvironmentError, match="multi-node.*MASTER_ADDR"):
        detect_launch(env)


def test_mpi_half_set_is_an_error() -> None:
    with pytest.raises(LaunchEnvironmentError, match="OMPI_COMM_WORLD_SIZE"):
        detect_launch({"OMPI_COMM_WORLD_RANK": "0"})
    with pytest.raises(LaunchEnvironmentError, match="PMI_RANK"):
        detect_launch({"PMI_SIZE": "2"})


# ------------------------------------------------------------------ job-id derived ports


@pytest.mark.parametrize("job_var", ["PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"])
def test_openmpi_ranks_of_one_job_share_a_port_and_jobs_differ(job_var: str) -> None:
    base = {k: v for k, v in OPENMPI.items() if k != "PMIX_NAMESPACE"}

    def port(rank: int, job: str) -> int:
        env = {**base, "OMPI_COMM_WORLD_RANK": str(rank),
               "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), job_var: job}
        return detect_launch(env).master_port

    assert port(0, "job-a") == port(1, "job-a")
    assert port(0, "job-a") != port(0, "job-b")


def test_mpich_port_comes_from_the_job_not_from_the_per_rank_pmi_id() -> None:
    def port(rank: int, job: str) -> int:
        env = {**MPICH, "MASTER_ADDR": "", "PMI_RANK": str(rank), "PMI_SIZE": "2",
               "MPI_LOCALRANKID": str(rank), "MPI_LOCALNRANKS": "2", "PMI_ID": str(rank),
               "PMI_JOBID": job}
        return detect_launch(env).master_port

    assert port(0, "17.0") == port(1, "17.0")
    assert port(0, "17.0") != port(0, "18.0")


def test_slurm_ranks_of_one_step_share_a_port_and_steps_differ() -> None:
    def port(rank: int, job: str, step: str) -> int:
        env = {**SLURM_ONE_NODE, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
               "SLURM_JOB_ID": job, "SLURM_STEP_ID": step}
        return detect_launch(env).master_port

    assert port(0, "9", "0") == port(1, "9", "0")
    assert port(0, "9", "0") != port(0, "10", "0")
    assert port(0, "9", "0") != port(0, "9", "1")


# ------------------------------------------------------------------ Slurm


def test_slurm_single_node() -> None:
    info = detect_launch(SLURM_ONE_NODE)
    assert _fields(info) == ("slurm", 1, 1, 2, 2, 0)
    assert info.master_addr == "127.0.0.1"


def test_slurm_multi_node_step_variables_and_first_host() -> None:
    info = detect_launch(SLURM_THREE_NODES)
    # SLURM_STEP_NUM_TASKS (7) wins over the allocation's SLURM_NTASKS (99)
    assert _fields(info) == ("slurm", 5, 1, 7, 2, 2)
    assert info.master_addr == "gpu01"
    last = detect_launch({**SLURM_THREE_NODES, "SLURM_PROCID": "6", "SLURM_LOCALID": "0",
                          "SLURM_NODEID": "3"})
    assert last.local_world_size == 1 and last.master_addr == "gpu01"


def test_slurm_multi_node_master_addr_overrides_node_list() -> None:
    info = detect_launch({**SLURM_THREE_NODES, "MASTER_ADDR": "10.9.9.9",
                          "SLURM_STEP_NODELIST": "weird[a-b]"})
    assert info.master_addr == "10.9.9.9"


def test_slurm_multi_node_without_any_address_is_an_error() -> None:
    env = {k: v for k, v in SLURM_THREE_NODES.items() if k != "SLURM_STEP_NODELIST"}
    with pytest.raises(LaunchEnvironmentError, match="MASTER_ADDR"):
        detect_launch(env)


def test_slurm_procid_without_task_count_is_an_error() -> None:
    with pytest.raises(LaunchEnvironmentError, match="SLURM_NTASKS"):
        detect_launch({"SLURM_PROCID": "0"})


@pytest.mark.parametrize("nodelist,hosts", [
    ("gpu[01-03,7],cpu-a", ["gpu01", "gpu02", "gpu03", "gpu7", "cpu-a"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("single", ["single"]),
    ("a,b", ["a", "b"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("r[1-2]-n[01,03]", ["r1-n01", "r1-n03", "r2-n01", "r2-n03"]),
    ("x[1,3],y[09-10]", ["x1", "x3", "y09", "y10"]),
])
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


def test_expand_nodelist_rejects_non_numeric_ranges() -> None:
    with pytest.raises(LaunchEnvironmentError, match="MASTER_ADDR"):
        expand_nodelist("n[a-c]")


# ------------------------------------------------------------------ precedence


def test_precedence_torchrun_over_mpi_over_slurm() -> None:
    everything = {**SLURM_ONE_NODE, **OPENMPI, **TORCHRUN}
    assert detect_launch(everything).launcher == "torchrun"
    mpi_and_slurm = {**SLURM_ONE_NODE, **MPICH}
    assert detect_launch(mpi_and_slurm).launcher == "mpich"
    assert detect_launch(mpi_and_slurm).rank == 2
    assert detect_launch({**SLURM_ONE_NODE, **OPENMPI}).launcher == "openmpi"
    # MVAPICH2 also sets PMI_* under hydra; its own variables are more specific
    assert detect_launch({**MVAPICH2, "PMI_RANK": "1", "PMI_SIZE": "2"}).launcher == "mvapich2"


# ------------------------------------------------------------------ half-set / invalid


@pytest.mark.parametrize("env,pattern", [
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK is set but RANK and WORLD_SIZE are not"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "rank 2 is outside world size 2"),
    ({"RANK": "-1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "outside world size"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "world size is 0"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2.0"}, "WORLD_SIZE='2.0' is not an integer"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, "local rank 2 is outside local world size 2"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "8"}, "local world size 8 is larger than world size 4"),
    ({**TORCHRUN, "MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
    ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "2"}, "openmpi: rank 2 is outside"),
    ({**SLURM_ONE_NODE, "SLURM_NTASKS": "x"}, "SLURM_NTASKS='x'"),
])
def test_half_set_or_invalid_environment_is_a_clear_error(env: dict[str, str],
                                                          pattern: str) -> None:
    with pytest.raises(LaunchEnvironmentError, match=pattern):
        detect_launch(env)


def test_launch_error_says_how_to_fix() -> None:
    with pytest.raises(LaunchEnvironmentError) as err:
        detect_launch({"RANK": "0"})
    assert "torchrun" in str(err.value) and "accel launch" in str(err.value)


# ------------------------------------------------------------------ ACCEL_* settings


def test_read_settings_defaults() -> None:
    assert read_settings({}) == EnvSettings()


def test_read_settings_parses_every_variable() -> None:
    settings = read_settings({
        "ACCEL_DEVICE": "cpu", "ACCEL_MIXED_PRECISION": "bf16",
        "ACCEL_GRADIENT_ACCUMULATION_STEPS": "4", "ACCEL_DEBUG": "true", "ACCEL_TIMEOUT": "90",
        "ACCEL_STALL_SECONDS": "2.5", "ACCEL_CONFIG_FILE": "/tmp/c.yaml", "ACCEL_LAUNCHED": "1",
    })
    assert settings == EnvSettings(device="cpu", mixed_precision="bf16",
                                   gradient_accumulation_steps=4, debug=True, timeout=90.0,
                                   stall_seconds=2.5, config_file="/tmp/c.yaml", launched=True)


@pytest.mark.parametrize("value,expected", [("1", True), ("ON", True), ("yes", True),
                                            ("0", False), ("", False), ("no", False)])
def test_read_settings_debug_flag(value: str, expected: bool) -> None:
    assert read_settings({"ACCEL_DEBUG": value}).debug is expected


def test_read_settings_empty_values_mean_unset() -> None:
    empty = {name: "" for name in ACCEL_VARIABLES}
    assert read_settings(empty) == EnvSettings()


@pytest.mark.parametrize("env,pattern", [
    ({"ACCEL_GRADIENT_ACCUMULATION_STEPS": "0"}, "must be >= 1"),
    ({"ACCEL_GRADIENT_ACCUMULATION_STEPS": "two"}, "not an integer"),
    ({"ACCEL_TIMEOUT": "soon"}, "ACCEL_TIMEOUT='soon' is not a number"),
    ({"ACCEL_TIMEOUT": "-5"}, "must be > 0"),
    ({"ACCEL_STALL_SECONDS": "0"}, "ACCEL_STALL_SECONDS='0' must be > 0"),
])
def test_read_settings_errors(env: dict[str, str], pattern: str) -> None:
    with pytest.raises(LaunchEnvironmentError, match=pattern):
        read_settings(env)


# ------------------------------------------------------------------ other readers


@pytest.mark.parametrize("value,expected", [
    (None, None), ("0,1", ["0", "1"]), ("", []), ("-1", []), (" 2 , 3 ", ["2", "3"]),
    ("GPU-8f1c2a3b-aaaa-bbbb-cccc-0123456789ab", ["GPU-8f1c2a3b-aaaa-bbbb-cccc-0123456789ab"]),
    ("1,-1,0", ["1"]),
])
def test_cuda_visible_devices(value: str | None, expected: list[str] | None) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert cuda_visible_devices(env) == expected


def test_pjrt_device() -> None:
    assert pjrt_device({}) is None
    assert pjrt_device({"PJRT_DEVICE": "CPU"}) == "CPU"
    assert pjrt_device({"XRT_TPU_CONFIG": "localservice;0;localhost:51011"}) == "TPU"
    assert pjrt_device({"PJRT_DEVICE": ""}) is None


def test_accel_variables_are_documented() -> None:
    assert all(name.startswith("ACCEL_") and text for name, text in ACCEL_VARIABLES.items())
    assert {"ACCEL_DEVICE", "ACCEL_MIXED_PRECISION", "ACCEL_DEBUG"} <= set(ACCEL_VARIABLES)


# ------------------------------------------------------------------ the ACCEL_* table


def test_table_fields_are_env_settings_fields_and_every_field_has_a_variable() -> None:
    fields = set(EnvSettings.__dataclass_fields__)
    mapped = [var.field for var in ACCEL_TABLE if var.field is not None]
    assert set(mapped) == fields and len(mapped) == len(fields)
    assert all(var.read is not None for var in ACCEL_TABLE if var.field is not None)
    assert set(ACCEL_VARIABLES) == {var.name for var in ACCEL_TABLE if var.documented}
    assert "ACCEL_AGENT_PID" not in ACCEL_VARIABLES  # plumbing, not in README's table


def test_settings_environment_is_the_inverse_of_read_settings() -> None:
    full = EnvSettings(device="cuda", mixed_precision="bf16", gradient_accumulation_steps=4,
                       debug=True, timeout=90.0, stall_seconds=2.5, config_file="/c.yaml",
                       launched=True, num_threads=3)
    for settings in (EnvSettings(), full, EnvSettings(device="cpu", launched=True)):
        assert read_settings(settings_environment(settings)) == settings
    assert settings_environment(EnvSettings()) == {}


def test_launch_setting_source_follows_the_table() -> None:
    assert launch_setting_source("device", {"ACCEL_DEVICE": "cpu"}) == ("ACCEL_DEVICE", "cpu")
    threads = {"OMP_NUM_THREADS": "5", "ACCEL_NUM_THREADS": "2"}
    assert launch_setting_source("num_cpu_threads_per_process", threads) == (
        "ACCEL_NUM_THREADS", "2")
    assert launch_setting_source("num_cpu_threads_per_process",
                                 {"ACCEL_NUM_THREADS": "", "OMP_NUM_THREADS": "5"}) == (
        "OMP_NUM_THREADS", "5")
    assert launch_setting_source("num_processes", {"ACCEL_NUM_PROCESSES": "4"}) is None
    assert launch_setting_source("debug", {}) is None


def test_worker_environment() -> None:
    env = worker_environment(EnvSettings(device="cpu", num_threads=2, launched=True),
                             cuda_visible_devices="", layout=(4, 2), fresh_rdzv_store=True)
    assert env == {"ACCEL_LAUNCHED": "1", "ACCEL_DEVICE": "cpu", "ACCEL_NUM_THREADS": "2",
                   "OMP_NUM_THREADS": "2", "ACCEL_NUM_PROCESSES": "4", "ACCEL_NUM_MACHINES": "2",
                   "CUDA_VISIBLE_DEVICES": "", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert worker_environment(EnvSettings()) == {"ACCEL_LAUNCHED": "1"}
    assert agent_environment(42) == {"ACCEL_AGENT_PID": "42"}


def test_small_readers() -> None:
    env = {"ACCEL_CONFIG_FILE": "/c.yaml", "XDG_CONFIG_HOME": "", "GLOO_SOCKET_IFNAME": "eth1",
           "TORCHELASTIC_ERROR_FILE": "/e.json", "RANK": "3", "ACCEL_AGENT_PID": "12",
           "ACCEL_NUM_PROCESSES": "4", "ACCEL_NUM_MACHINES": "2", "WORLD_SIZE": "4",
           "ACCEL_DEBUG": "1"}
    assert (config_file_variable(env), config_home(env)) == ("/c.yaml", None)
    assert (gloo_socket_ifname(env), error_file(env)) == ("eth1", "/e.json")
    assert worker_ranks(env) == ("3", "?") and agent_pid(env) == 12
    assert agent_pid({"ACCEL_AGENT_PID": "x"}) is None
    assert requested_layout(env) == ("4", "2") and formed_layout(env) is None
    assert formed_layout({"WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2"}) == ("4", "2")
    assert accel_environment(env) == {"ACCEL_DEBUG": "1", "ACCEL_CONFIG_FILE": "/c.yaml"}
    assert cpu_count() >= 1


def test_apply_sets_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TEST_APPLY", "0")  # restored by monkeypatch afterwards
    apply({"ACCEL_TEST_APPLY": "1"})
    assert current()["ACCEL_TEST_APPLY"] == "1"


def test_every_name_of_the_old_module_is_still_importable() -> None:
    import accel.env

    old = ["ACCEL_VARIABLES", "EnvSettings", "LaunchEnvironmentError", "LaunchInfo", "cpu_count",
           "cuda_visible_devices", "detect_launch", "expand_nodelist", "log_level",
           "pjrt_device", "read_settings", "DEFAULT_PORT"]
    assert all(hasattr(accel.env, name) for name in old)
    assert set(accel.env.__all__) >= set(old) - {"DEFAULT_PORT"}


def test_patched_restores_and_refuses_non_strings() -> None:
    import os

    from accel.env import patched

    with pytest.raises(TypeError, match="convert the value with str"):
        with patched({"ACCEL_T_INT": 1}):  # type: ignore[dict-item]
            pass
    assert "ACCEL_T_INT" not in os.environ
    with pytest.raises(RuntimeError), patched({"ACCEL_T_A": "1"}):
        assert os.environ["ACCEL_T_A"] == "1"
        raise RuntimeError
    assert "ACCEL_T_A" not in os.environ
